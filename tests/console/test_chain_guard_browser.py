"""The operator's task page in a real browser: the links to the task's audit history and its signed
export, a broken chain shown, and a control that needs the break confirmed (refused by the server
when the browser's own check is bypassed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from audit.export_check import check_file
from audit.keys import anchor_public_keys
from tasks.models import Task
from tasks.states import State
from tests.audit.owner import task_with_history
from tests.console.test_chain_guard import break_chain
from tests.second_factor import browser_log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_task_page_links_to_the_history_and_a_signed_export(
    page: Page, live_server, acme, operator, tmp_path: Path
):
    task = task_with_history(acme, steps=2)
    browser_log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    expect(page.locator(".badge.broken")).to_have_count(0)

    with page.expect_download() as info:
        page.get_by_role("link", name="JSON (signed)").click()
    saved = tmp_path / info.value.suggested_filename
    info.value.save_as(saved)
    outcome = check_file(saved, anchor_public_keys())  # the public key alone
    assert outcome.ok and f"task {task.id}, 3 events" in outcome.message
    assert json.loads(saved.read_text())["signature"]["algorithm"] == "ed25519"

    page.get_by_role("link", name="History and integrity").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("History of task")
    expect(page.locator(".badge.intact")).to_contain_text("Chain intact")


def test_a_broken_chain_is_shown_and_a_control_needs_it_confirmed(page: Page, live_server, acme, operator):
    task = task_with_history(acme, steps=2)
    break_chain(task, version=2)
    browser_log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    expect(page.locator(".badge.broken")).to_contain_text("Chain broken at v2")

    form = page.locator('form[action$="/cancel/"]')
    form.get_by_placeholder("Reason (required)").fill("customer asked")
    form.locator('input[name="confirm"]').check()
    confirm_chain = form.get_by_label("I know this task's audit chain is broken at v2")
    expect(confirm_chain).to_have_attribute("required", "")
    # Past the browser's own check: the server refuses a control that does not confirm the break.
    confirm_chain.evaluate("box => box.removeAttribute('required')")
    form.get_by_role("button", name="Cancel").click()
    expect(page.get_by_text("Nothing changed: this task's audit chain is broken at v2")).to_be_visible()
    assert Task.objects.get(pk=task.pk).state == State.READY

    form = page.locator('form[action$="/cancel/"]')
    form.get_by_placeholder("Reason (required)").fill("customer asked")
    form.locator('input[name="confirm"]').check()
    form.get_by_label("I know this task's audit chain is broken at v2").check()
    form.get_by_role("button", name="Cancel").click()
    expect(page.get_by_text("Cancel applied")).to_be_visible()
    assert Task.objects.get(pk=task.pk).state != State.READY
