"""The audit pages: search, a task's history with its integrity badge, exports verified offline."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from audit import export
from audit import selectors as audit_selectors
from audit.chain import GENESIS, HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, link_hash, verify_events
from audit.keys import chain_keys
from audit.models import LeaseTakeover, TransitionEvent
from console import audit as audit_views
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

CHAIN_FIELDS = (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)


def recomputed(record: dict[str, Any]) -> str:
    """An exported event's hash, recomputed from its fields with the chain key it names."""
    fields = {name: record[name] for name in CHAIN_FIELDS}
    return link_hash(record["prev_hash"], fields, key_id=record["key_id"], keys=chain_keys())


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def task_with_history(tenant, steps: int = 3, **overrides: Any) -> Task:
    task = make_task(tenant, **overrides)
    for n in range(steps):
        task = advance(
            task.id, task.state_version, State.READY, actor=Actor.worker("w1"), progress=progress(f"s{n}")
        )
    return task


def tamper_head(task: Task) -> None:
    """Edit the task's chain head by SQL, as someone with database access could."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", ["f" * 64, task.id])


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def as_events(records: list[dict[str, Any]]) -> list[SimpleNamespace]:
    """Exported records as the objects ``verify_events`` reads (attributes, not keys)."""
    return [SimpleNamespace(**record) for record in records]


def from_csv(text: str) -> list[dict[str, Any]]:
    """CSV cells back to the JSON types the hash saw: the formula guard undone, integers, and null
    for an empty parent."""
    rows = [
        {name: export.cell_text(cell) for name, cell in row.items()}
        for row in csv.DictReader(io.StringIO(text))
    ]
    for row in rows:
        for name in ("tenant_id", "state_version", "attempt", "event_id"):
            row[name] = int(row[name])
        row["parent_id"] = row["parent_id"] or None
    return rows


# --- Who may see it ---------------------------------------------------------------------------


def test_the_audit_log_needs_a_login(client):
    response = client.get("/console/audit/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("who", ["auditor", "operator", "admin_user"])
def test_auditors_operators_and_admins_may_search(request, who, acme):
    task_with_history(acme, steps=1)
    assert client_for(request.getfixturevalue(who)).get("/console/audit/").status_code == 200


def test_an_approver_may_not_search_or_export_the_audit_log(approver, acme):
    task = task_with_history(acme, steps=1)
    client = client_for(approver)
    assert client.get("/console/audit/").status_code == 403
    assert client.get("/console/audit/export.json").status_code == 403
    assert client.get(f"/console/audit/tasks/{task.id}/").status_code == 403
    assert client.get(f"/console/audit/tasks/{task.id}/export.csv").status_code == 403


def test_search_lists_only_the_users_tenants(auditor, acme, globex):
    mine = task_with_history(acme, steps=1)
    theirs = task_with_history(globex, steps=1)
    page = client_for(auditor).get("/console/audit/").content.decode()
    assert str(mine.id) in page and str(theirs.id) not in page


def test_another_tenants_task_history_and_export_are_404(outsider, acme):
    task = task_with_history(acme, steps=1)
    client = client_for(outsider)
    assert client.get(f"/console/audit/tasks/{task.id}/").status_code == 404
    assert client.get(f"/console/audit/tasks/{task.id}/export.json").status_code == 404


def test_the_search_export_leaves_out_other_tenants(auditor, acme, globex):
    task_with_history(acme, steps=1)
    theirs = task_with_history(globex, steps=1)
    exported = json.loads(body(client_for(auditor).get("/console/audit/export.json")))
    assert exported["count"] == 2 and str(theirs.id) not in json.dumps(exported)


def test_the_audit_pages_are_read_only_for_an_auditor(auditor, acme):
    task = task_with_history(acme, steps=1)
    client = client_for(auditor)
    for url in ("/console/audit/", f"/console/audit/tasks/{task.id}/"):
        assert 'method="post"' not in client.get(url).content.decode().split("<main")[1]
        assert client.post(url).status_code == 405


# --- Search -------------------------------------------------------------------------------------


def test_search_filters_by_actor(auditor, acme):
    task = make_task(acme, objective="Moved by w7")
    advance(task.id, 1, State.READY, actor=Actor.worker("w7"), progress=progress())
    make_task(acme, objective="Never moved")
    page = client_for(auditor).get("/console/audit/", {"actor": "w7"})
    assert [e.actor_id for e in page.context["page"].events] == ["worker:w7"]


def test_search_filters_by_trigger_and_states(auditor, acme):
    held = make_task(acme)
    advance(held.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="quarantine")
    task_with_history(acme, steps=1)
    client = client_for(auditor)
    by_trigger = client.get("/console/audit/", {"trigger": "quarantine"}).context["page"].events
    by_states = client.get("/console/audit/", {"from_state": "ready", "to_state": "quarantined"})
    assert [e.task_id for e in by_trigger] == [held.id]
    assert [e.task_id for e in by_states.context["page"].events] == [held.id]


def test_search_filters_by_task_type(auditor, acme):
    invoice = make_task(
        acme, task_type="pay_invoice", objective="Pay", input={"invoice_id": "I-9", "amount": "9.00"}
    )
    make_task(acme)
    events = client_for(auditor).get("/console/audit/", {"task_type": "pay_invoice"}).context["page"].events
    assert [e.task_id for e in events] == [invoice.id]


def test_search_filters_by_reason_text_and_code(auditor, acme):
    held = make_task(acme)
    advance(
        held.id,
        1,
        State.QUARANTINED,
        actor=Actor.system("t"),
        reason="Checkpoint body does not decode",
        reason_code="checkpoint_corrupt",
    )
    make_task(acme)
    client = client_for(auditor)
    assert len(client.get("/console/audit/", {"reason": "DOES NOT decode"}).context["page"].events) == 1
    assert len(client.get("/console/audit/", {"reason": "checkpoint_corr"}).context["page"].events) == 1


def test_search_filters_by_time_range(auditor, acme):
    early = make_task(acme)
    middle = timezone.now()
    late = make_task(acme)
    client = client_for(auditor)
    after = client.get("/console/audit/", {"since": middle.isoformat()}).context["page"].events
    before = client.get("/console/audit/", {"until": middle.isoformat()}).context["page"].events
    assert [e.task_id for e in after] == [late.id] and [e.task_id for e in before] == [early.id]


def test_search_shows_times_in_one_format_with_the_timezone(auditor, acme):
    event = make_task(acme).events.get()
    page = client_for(auditor).get("/console/audit/").content.decode()
    assert event.created_at.strftime("%Y-%m-%d %H:%M:%S UTC") in page


def test_search_pages_newest_first_by_a_cursor(auditor, acme, monkeypatch):
    monkeypatch.setattr(audit_views, "PAGE", 3)
    task = task_with_history(acme, steps=6)  # seven events
    client = client_for(auditor)
    seen, url, params = [], "/console/audit/", {}
    while True:
        page = client.get(url, params).context["page"]
        seen += [e.state_version for e in page.events]
        if page.next_cursor is None:
            break
        params = {"before": str(page.next_cursor)}
    assert seen == [7, 6, 5, 4, 3, 2, 1]
    assert TransitionEvent.objects.filter(task=task).count() == 7


def test_a_mangled_cursor_or_date_never_errors(auditor, acme):
    make_task(acme)
    client = client_for(auditor)
    assert len(client.get("/console/audit/", {"before": "x_y"}).context["page"].events) == 1
    response = client.get("/console/audit/", {"since": "yesterday-ish"})
    assert response.status_code == 400 and "Check the search" in response.content.decode()
    assert client.get("/console/audit/export.csv", {"since": "nope"}).status_code == 400


def test_the_search_page_runs_a_bounded_number_of_queries(
    auditor, acme, globex, django_assert_max_num_queries
):
    for _ in range(3):
        task_with_history(acme, steps=20)
    client = client_for(auditor)
    with django_assert_max_num_queries(5):
        response = client.get("/console/audit/", {"actor": "w1"})
    assert len(response.context["page"].events) == audit_views.PAGE


# --- A task's history -----------------------------------------------------------------------------


def test_the_history_shows_every_event_numbered_with_its_chain_fields(auditor, acme):
    task = task_with_history(acme, steps=2)
    page = client_for(auditor).get(f"/console/audit/tasks/{task.id}/").content.decode()
    for event in TransitionEvent.objects.filter(task=task):
        assert f'id="v{event.state_version}"' in page
        assert event.prev_hash in page and event.hash in page
        if event.checkpoint_digest:
            assert event.checkpoint_digest in page
    assert TransitionEvent.objects.filter(task=task).exclude(checkpoint_digest="").exists()


def test_the_history_pages_by_version(auditor, acme, monkeypatch):
    monkeypatch.setattr(audit_views, "HISTORY_PAGE", 2)
    task = task_with_history(acme, steps=3)  # v1..v4
    client = client_for(auditor)
    first = client.get(f"/console/audit/tasks/{task.id}/").context["page"]
    second = client.get(f"/console/audit/tasks/{task.id}/", {"after": first.next_after}).context["page"]
    assert [e.state_version for e in first.events] == [1, 2]
    assert [e.state_version for e in second.events] == [3, 4] and second.next_after is None


def test_the_integrity_badge_is_green_for_an_untouched_chain(auditor, acme):
    task = task_with_history(acme)
    page = client_for(auditor).get(f"/console/audit/tasks/{task.id}/").content.decode()
    assert "Chain intact" in page and "Chain broken" not in page


def test_the_integrity_badge_is_red_when_the_head_was_edited(auditor, acme):
    task = task_with_history(acme)
    tamper_head(task)
    page = client_for(auditor).get(f"/console/audit/tasks/{task.id}/").content.decode()
    assert "Chain broken" in page and "chain head does not match the newest event" in page
    assert "Chain intact" not in page


def test_the_history_lists_lease_takeovers(auditor, acme):
    task = make_task(acme)
    now = timezone.now()
    LeaseTakeover.objects.create(
        task=task,
        worker_id="w-new",
        token=2,
        previous_worker_id="w-dead",
        stale_token=1,
        previous_heartbeat_at=now - timedelta(seconds=40),
        previous_expires_at=now - timedelta(seconds=10),
        taken_at=now,
    )
    page = client_for(auditor).get(f"/console/audit/tasks/{task.id}/").content.decode()
    assert "w-new" in page and "w-dead" in page and "#1 → #2" in page


def test_the_history_page_runs_a_bounded_number_of_queries(auditor, acme, django_assert_max_num_queries):
    task = task_with_history(acme, steps=150)
    client = client_for(auditor)
    # With when the chain was keyed, the last anchor run, the task's lease takeovers (their chain), and
    # the verified-through mark: read it and its event, move it (first view), or read them (later).
    with django_assert_max_num_queries(14):
        response = client.get(f"/console/audit/tasks/{task.id}/")
    assert len(response.context["page"].events) == audit_views.HISTORY_PAGE
    with django_assert_max_num_queries(14):
        client.get(f"/console/audit/tasks/{task.id}/")


# --- Exports, verified offline --------------------------------------------------------------------


def test_the_json_export_of_a_task_verifies_offline(auditor, acme, monkeypatch):
    monkeypatch.setattr(audit_selectors, "EXPORT_PAGE", 2)  # several keyset pages
    task = task_with_history(acme, steps=4)
    response = client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.json")
    assert response.streaming and "attachment" in response["Content-Disposition"]
    exported = json.loads(body(response))

    records = exported["events"]
    assert exported["count"] == len(records) == 5
    assert exported["hash"]["fields"] == list(HASHED_FIELDS) and exported["hash"]["genesis"] == GENESIS
    for record in records:  # each hash recomputed from the exported fields, as they are
        assert recomputed(record) == record["hash"]
    head = exported["task"]
    assert (
        verify_events(
            head["id"],
            as_events(records),
            head=head["audit_head"],
            state_version=head["state_version"],
            keys=chain_keys(),
        )
        is None
    )


def test_the_csv_export_of_a_task_verifies_offline(auditor, acme, monkeypatch):
    monkeypatch.setattr(audit_selectors, "EXPORT_PAGE", 2)
    task = task_with_history(acme, steps=4)
    response = client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.csv")
    assert response["Content-Type"].startswith("text/csv")
    records = from_csv(body(response))

    assert [r["state_version"] for r in records] == [1, 2, 3, 4, 5]
    for record in records:
        assert recomputed(record) == record["hash"]
    head = Task.objects.get(pk=task.pk)  # shown on the history page, and in the file name
    assert f"-v{head.state_version}.csv" in response["Content-Disposition"]
    assert (
        verify_events(
            task.id,
            as_events(records),
            head=head.audit_head,
            state_version=head.state_version,
            keys=chain_keys(),
        )
        is None
    )


def test_a_csv_export_with_a_formula_reason_is_guarded_and_still_verifies_offline(auditor, acme):
    formula = '=HYPERLINK("https://evil.example/","open")'
    task = task_with_history(acme, steps=1)
    advance(task.id, 2, State.READY, actor=Actor.worker("w1"), progress=progress("s1"), reason=formula)
    text = body(client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.csv"))
    cells = [cell for row in csv.reader(io.StringIO(text)) for cell in row]
    assert f"'{formula}" in cells and formula not in cells  # text to a spreadsheet, never a formula
    records = from_csv(text)

    assert records[-1]["reason"] == formula  # the guard undone is the text the hash saw
    head = Task.objects.get(pk=task.pk)
    assert all(recomputed(record) == record["hash"] for record in records)
    assert (
        verify_events(
            task.id,
            as_events(records),
            head=head.audit_head,
            state_version=head.state_version,
            keys=chain_keys(),
        )
        is None
    )


def test_an_edited_export_no_longer_verifies(auditor, acme):
    task = task_with_history(acme, steps=2)
    exported = json.loads(body(client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.json")))
    exported["events"][1]["actor_id"] = "worker:someone-else"
    head = exported["task"]
    link = verify_events(
        head["id"],
        as_events(exported["events"]),
        head=head["audit_head"],
        state_version=head["state_version"],
        keys=chain_keys(),
    )
    assert link is not None and link.state_version == 2


def test_the_search_export_streams_every_page_with_verifiable_events(auditor, acme, monkeypatch):
    monkeypatch.setattr(audit_selectors, "EXPORT_PAGE", 3)
    task_with_history(acme, steps=3)
    task_with_history(acme, steps=3)
    response = client_for(auditor).get("/console/audit/export.json", {"actor": "w1"})
    exported = json.loads(body(response))

    assert exported["search"] == {"actor": "w1"} and exported["count"] == 6
    stamps = [(r["created_at"], r["event_id"]) for r in exported["events"]]
    assert stamps == sorted(stamps, reverse=True) and len(set(stamps)) == 6  # newest first, none twice
    for record in exported["events"]:
        assert recomputed(record) == record["hash"]


def test_the_search_export_as_csv_has_the_chain_columns(auditor, acme):
    task_with_history(acme, steps=1)
    records = from_csv(body(client_for(auditor).get("/console/audit/export.csv")))
    assert len(records) == 2
    for record in records:
        assert recomputed(record) == record["hash"]


def test_an_unknown_export_format_is_404(auditor, acme):
    task = make_task(acme)
    assert client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.xml").status_code == 404


def test_a_task_export_stops_at_the_head_it_reports(auditor, acme):
    task = task_with_history(acme, steps=1)
    exported = json.loads(body(client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.json")))
    assert exported["task"]["state_version"] == exported["events"][-1]["state_version"] == 2
    assert exported["task"]["audit_head"] == exported["events"][-1]["hash"]


def test_a_creation_event_links_to_genesis_in_the_export(auditor, acme):
    task = make_task(acme)
    advance(
        task.id, 1, State.QUARANTINED, actor=Actor.system("t"), trigger=Trigger.QUARANTINE, reason_code="x"
    )
    exported = json.loads(body(client_for(auditor).get(f"/console/audit/tasks/{task.id}/export.json")))
    assert exported["events"][0]["prev_hash"] == GENESIS and exported["events"][0]["parent_id"] is None
