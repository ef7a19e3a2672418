"""Quarantine triage: held tasks by reason, with what release would do; scoped and read-only."""

from __future__ import annotations

import json

import pytest
from django.db.models import Count
from django.test import Client

from console import quarantine as quarantine_views
from reads import quarantine
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.foreign_checkpoints import written_as

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def quarantined(tenant, code: str, reason: str = "", **overrides) -> Task:
    task = make_task(tenant, **overrides)
    return advance(
        task.id,
        1,
        State.QUARANTINED,
        actor=Actor.system("tests"),
        reason=reason or f"held: {code}",
        reason_code=code,
    )


def test_the_triage_list_needs_a_login(client):
    response = client.get("/console/quarantine/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_quarantined_tasks_are_counted_per_reason(operator, acme):
    for _ in range(3):
        quarantined(acme, "step_error")
    quarantined(acme, "checkpoint_corrupt")
    make_task(acme)  # not quarantined
    counts = client_for(operator).get("/console/quarantine/").context["counts"]
    assert [(row["code"], row["n"]) for row in counts] == [("step_error", 3), ("checkpoint_corrupt", 1)]


def test_the_list_of_a_reason_shows_the_human_reason_and_links_to_the_task(operator, acme):
    task = quarantined(acme, "checkpoint_corrupt", reason="checkpoint v3 does not decode")
    quarantined(acme, "step_error")
    page = client_for(operator).get("/console/quarantine/", {"reason": "checkpoint_corrupt"}).content.decode()
    assert "checkpoint v3 does not decode" in page
    assert f'href="/console/tasks/{task.id}/"' in page
    assert "held: step_error" not in page  # another reason's task is on its own list


def test_the_list_says_what_release_will_do(operator, acme):
    quarantined(acme, "checkpoint_schema_newer")
    page = client_for(operator).get("/console/quarantine/").content.decode()
    assert "Release re-runs resume validation" in page
    assert "the task&#x27;s deadline" in page and "each evidence record" in page
    assert "only once this deployment reads that schema" in page


def test_an_escalated_task_stays_under_the_reason_it_was_quarantined_for(operator, acme):
    task = quarantined(acme, "resend_limit_reached", reason="effect not performed after 5 sends")
    advance(
        task.id,
        2,
        State.QUARANTINED,
        actor=Actor.system("tests"),
        trigger=Trigger.ESCALATE,
        reason="please look",
        reason_code="escalate",
        escalation_level=1,
        escalated_to="admin",
    )
    response = client_for(operator).get("/console/quarantine/")
    assert [row["code"] for row in response.context["counts"]] == ["resend_limit_reached"]
    page = response.content.decode()
    assert "effect not performed after 5 sends" in page and "L1 → admin" in page


def test_an_operator_hold_is_its_own_reason(operator, acme):
    quarantined(acme, "quarantine", reason="customer dispute, hold")
    page = client_for(operator).get("/console/quarantine/").content.decode()
    assert "customer dispute, hold" in page and "Held by an operator" in page


def test_another_tenants_quarantined_tasks_are_not_listed(outsider, acme, globex):
    theirs = quarantined(acme, "step_error")
    mine = quarantined(globex, "step_error")
    response = client_for(outsider).get("/console/quarantine/")
    page = response.content.decode()
    assert str(mine.id) in page and str(theirs.id) not in page
    assert response.context["counts"][0]["n"] == 1


def test_an_auditor_reads_the_list_without_controls(auditor, acme):
    quarantined(acme, "step_error")
    client = client_for(auditor)
    response = client.get("/console/quarantine/")
    assert response.status_code == 200
    assert 'method="post"' not in response.content.decode().split("<main")[1]
    assert client.post("/console/quarantine/").status_code == 405


def test_an_approver_has_no_triage_list(approver, acme):
    quarantined(acme, "step_error")
    assert client_for(approver).get("/console/quarantine/").status_code == 403


def test_an_unknown_reason_shows_the_largest_group(operator, acme):
    quarantined(acme, "step_error")
    response = client_for(operator).get("/console/quarantine/", {"reason": "no-such-reason"})
    assert response.context["code"] == "step_error" and len(response.context["page"].tasks) == 1


def test_nothing_quarantined_says_so(operator, acme):
    make_task(acme)
    assert (
        "No task of your tenants is quarantined"
        in client_for(operator).get("/console/quarantine/").content.decode()
    )


def test_the_list_pages_longest_held_first(operator, acme, monkeypatch):
    monkeypatch.setattr(quarantine_views, "PAGE", 2)
    held = [quarantined(acme, "step_error").id for _ in range(5)]
    client = client_for(operator)
    seen, params = [], {"reason": "step_error"}
    while True:
        page = client.get("/console/quarantine/", params).context["page"]
        seen += [task.id for task in page.tasks]
        if page.next_cursor is None:
            break
        params = {"reason": "step_error", "after": str(page.next_cursor)}
    assert seen == held


def test_the_triage_list_runs_a_bounded_number_of_queries(operator, acme, django_assert_max_num_queries):
    for n in range(60):
        quarantined(acme, "step_error" if n % 2 else f"checkpoint_reason_{n % 6}")
    client = client_for(operator)
    with django_assert_max_num_queries(6):  # 5 for the page, 1 for the navigation's alerts badge
        response = client.get("/console/quarantine/", {"reason": "step_error"})
    assert len(response.context["page"].tasks) == 30


def test_an_operator_acts_on_every_task_held_for_a_reason_through_the_bulk_preview(operator, acme):
    held = [quarantined(acme, "resend_limit_reached") for _ in range(2)]
    advance(  # escalated while held: still held for the same reason
        held[1].id, 2, State.QUARANTINED, actor=Actor.system("tests"), trigger=Trigger.ESCALATE,
        reason="look", reason_code="escalate", escalation_level=1, escalated_to="admin",
    )  # fmt: skip
    quarantined(acme, "step_error")
    client = client_for(operator)
    page = client.get("/console/quarantine/", {"reason": "resend_limit_reached"}).content.decode()
    assert 'name="held" value="resend_limit_reached"' in page and 'value="retry_migration"' not in page
    preview = client.get(
        "/console/bulk/new/", {"held": "resend_limit_reached", "control": "release", "target": "all"}
    )
    assert preview.status_code == 200 and preview.context["count"] == 2
    assert {task.id for task in preview.context["sample"]} == {task.id for task in held}
    assert preview.context["back"] == "/console/quarantine/?reason=resend_limit_reached"
    confirmed = client.post(
        "/console/bulk/new/",
        {"held": "resend_limit_reached", "control": "release", "target": "all", "reason": "system checked"},
    )
    assert confirmed.status_code == 302
    assert {Task.objects.get(pk=task.pk).state for task in held} == {State.RESUME_VALIDATION}
    assert Task.objects.filter(state=State.QUARANTINED).count() == 1  # the step error stays held


def test_retry_migration_in_bulk_reports_the_checkpoints_that_still_do_not_read(operator, acme):
    from runtime.models import BulkOperation, Outcome

    readable = quarantined(acme, "checkpoint_unmigratable")
    with written_as(body="{not json", schema_version=2):
        broken = make_task(acme)
    advance(broken.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="checkpoint_unmigratable")
    client = client_for(operator)
    client.post(
        "/console/bulk/new/",
        {
            "held": "checkpoint_unmigratable",
            "control": "retry_migration",
            "target": "all",
            "reason": "v3 deployed",
        },
    )
    results = {r.task_id: r for r in BulkOperation.objects.get().results.all()}
    assert results[readable.id].outcome == Outcome.APPLIED
    assert results[broken.id].outcome == Outcome.REFUSED and "checkpoint_corrupt" in results[broken.id].detail
    assert Task.objects.get(pk=broken.pk).state == State.QUARANTINED


def test_an_unreadable_checkpoint_is_shown_as_stored_on_the_task_page(operator, acme):
    with written_as(body='{"schema_version": 2, "step": <garbled>', schema_version=2):
        task = make_task(acme)
    page = client_for(operator).get(f"/console/tasks/{task.id}/").content.decode()
    assert "This checkpoint cannot be read" in page
    assert "schema 2 · codec" in page and "&quot;step&quot;: &lt;garbled&gt;" in page


def _subplan_loops(plan: dict) -> int:
    """How many times the plan's correlated subqueries (the quarantine entry lookups) ran."""
    loops = plan.get("Actual Loops", 0) if plan.get("Parent Relationship") == "SubPlan" else 0
    return loops + sum(_subplan_loops(child) for child in plan.get("Plans", []))


def test_the_counts_read_the_quarantining_event_only_of_a_task_that_moved_since(acme):
    """The reason code of a task whose last transition quarantined it is its own ``state_reason``: the
    counts read no event for it. A task escalated while held (a self-loop since) still has its
    quarantining event read, and counts under the reason it was held for."""
    from django.db import connection

    from reads.quarantine import _quarantined

    for n in range(6):
        quarantined(acme, "step_error" if n % 2 else "evidence_missing")
    held = quarantined(acme, "resend_limit_reached")
    advance(
        held.id, 2, State.QUARANTINED, actor=Actor.system("tests"), trigger=Trigger.ESCALATE,
        reason="please look", reason_code="escalate", escalation_level=1, escalated_to="admin",
    )  # fmt: skip
    gone = quarantined(acme, "checkpoint_corrupt")  # its history gone with retention: the task's reason
    with connection.cursor() as cursor:  # as retention deletes history
        cursor.execute("SET LOCAL audit.retention = on")
        cursor.execute("DELETE FROM audit_transitionevent WHERE task_id = %s", [gone.id])
        cursor.execute("SET LOCAL audit.retention = off")

    counts = quarantine.quarantine_counts([acme.pk])
    assert {row["code"]: row["n"] for row in counts} == {
        "step_error": 3, "evidence_missing": 3, "resend_limit_reached": 1, "checkpoint_corrupt": 1,
    }  # fmt: skip
    rows = _quarantined([acme.pk]).values("quarantine_code").annotate(n=Count("id")).order_by()
    sql, params = rows.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = plan[0]["Plan"] if isinstance(plan, list) else json.loads(plan)[0]["Plan"]
    assert _subplan_loops(plan) == 1  # the escalated task's, not one a task (8)
