"""The auditor's journey in a real headless browser: search, history, badge, export verified offline."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from playwright.sync_api import Page, expect

from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, link_hash, verify_events
from audit.keys import chain_keys
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress
from tests.second_factor import browser_log_in

pytestmark = pytest.mark.django_db(transaction=True)


def log_in(page: Page, base: str, username: str) -> None:
    browser_log_in(page, base, username)  # with the second factor when asked
    expect(page).to_have_url(f"{base}/console/audit/")  # auditors land on the audit log


def test_an_auditor_searches_opens_a_history_and_verifies_its_export(
    page: Page, live_server, acme, auditor, tmp_path: Path
):
    task = make_task(acme, objective="Refund order A-1")
    for n in range(3):
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            actor=Actor.worker("w-audit"),
            progress=progress(f"s{n}"),
        )
    make_task(acme, objective="Someone else's refund")  # a creation event by another actor
    log_in(page, live_server.url, "acme-auditor")

    page.get_by_role("link", name="Audit").click()
    expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
    page.get_by_label("Actor").fill("w-audit")
    page.get_by_role("button", name="Search").click()
    rows = page.locator("table.events tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("worker:w-audit")
    expect(rows.first).to_contain_text("UTC")
    rows.first.get_by_role("link").first.click()

    expect(page.get_by_role("heading", level=1)).to_contain_text("History of task")
    expect(page.locator(".badge.intact")).to_contain_text("Chain intact")
    expect(page.locator("table.events tbody tr")).to_have_count(4)
    expect(page.locator("code.head")).to_have_text(task.audit_head)
    with page.expect_download() as info:
        page.get_by_role("link", name="JSON").click()
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)

    exported = json.loads(saved.read_text())
    fields = (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)
    for record in exported["events"]:
        covered = {name: record[name] for name in fields}
        key_id = record["key_id"]
        assert link_hash(record["prev_hash"], covered, key_id=key_id, keys=chain_keys()) == record["hash"]
    head = exported["task"]
    events = [SimpleNamespace(**record) for record in exported["events"]]
    assert head["id"] == str(task.id) and len(events) == 4
    assert (
        verify_events(
            head["id"],
            events,
            head=head["audit_head"],
            state_version=head["state_version"],
            keys=chain_keys(),
        )
        is None
    )
