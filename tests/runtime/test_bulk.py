"""Bulk operator actions (runtime.bulk): one control, one reason, per-task results, never an overwrite."""

from __future__ import annotations

import pytest
from django.test import Client

from audit.models import TransitionEvent
from runtime import bulk
from runtime.models import BulkOperation, BulkResult, BulkStatus, Outcome
from runtime.workers import bulk_run as bulk_run_task
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def create(user, tasks, control="cancel", reason="Supplier outage", **kwargs) -> BulkOperation:
    ids = [task.id for task in tasks]
    return bulk.bulk_create(
        user=user,
        control=control,
        reason=reason,
        tasks=Task.objects.filter(id__in=ids),
        selection={"ids": [str(i) for i in ids]},
        **kwargs,
    )


def outcomes(operation: BulkOperation) -> dict[str, str]:
    return {str(r.task_id): r.outcome for r in BulkResult.objects.filter(operation=operation)}


def test_bulk_cancel_applies_each_control_with_the_reason_and_the_operation_in_the_audit(operator, acme):
    tasks = [make_task(acme, objective=f"Refund {n}") for n in range(3)]
    operation = bulk.bulk_run(create(operator, tasks).id, runner="test")
    assert operation.status == BulkStatus.DONE and (operation.applied, operation.done) == (3, 3)
    assert set(Task.objects.values_list("state", flat=True)) == {State.CANCEL_REQUESTED}
    event = TransitionEvent.objects.filter(task=tasks[0], to_state=State.CANCEL_REQUESTED).get()
    assert event.reason == f"Supplier outage (bulk {operation.id})"


def test_a_task_changed_after_confirmation_is_recorded_stale_and_left_alone(operator, acme):
    moved, kept = make_task(acme), make_task(acme)
    operation = create(operator, [moved, kept])
    advance(moved.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="checkpoint_corrupt")
    bulk.bulk_run(operation.id, runner="test")
    assert outcomes(operation) == {str(moved.id): Outcome.STALE, str(kept.id): Outcome.APPLIED}
    result = BulkResult.objects.get(operation=operation, task_id=moved.id)
    assert (result.state_after, result.version_after) == (State.QUARANTINED, 2)
    assert "now quarantined v2" in result.detail
    assert Task.objects.get(pk=moved.id).state == State.QUARANTINED  # not overwritten


def test_a_control_the_table_forbids_is_refused_with_why(operator, acme):
    done = make_task(acme)
    advance(done.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger="complete")
    operation = bulk.bulk_run(create(operator, [done]).id, runner="test")
    result = BulkResult.objects.get(operation=operation)
    assert result.outcome == Outcome.REFUSED and "not possible from completed" in result.detail
    assert operation.refused == 1


def test_a_control_already_in_effect_is_unchanged(operator, acme):
    task = make_task(acme)
    advance(
        task.id, 1, State.CANCEL_REQUESTED, actor=Actor.user(operator, ActorKind.OPERATOR), trigger="cancel"
    )
    operation = bulk.bulk_run(create(operator, [Task.objects.get(pk=task.id)]).id, runner="test")
    assert outcomes(operation) == {str(task.id): Outcome.UNCHANGED}


def test_the_reason_is_required(operator, acme):
    with pytest.raises(bulk.BulkRefused, match="reason"):
        create(operator, [make_task(acme)], reason="   ")
    assert not BulkOperation.objects.exists()


def test_an_auditor_cannot_apply_a_bulk_control(auditor, acme):
    operation = bulk.bulk_run(create(auditor, [make_task(acme)]).id, runner="test")
    assert outcomes(operation) != {} and set(outcomes(operation).values()) == {Outcome.REFUSED}
    assert Task.objects.get().state == State.READY


def test_the_console_bulk_only_reaches_tasks_in_the_users_tenants(operator, outsider, acme, globex):
    mine, theirs = make_task(acme), make_task(globex)
    client = Client()
    client.force_login(operator)
    response = client.post(
        "/console/bulk/new/",
        {"control": "cancel", "target": "selected", "ids": [mine.id, theirs.id], "reason": "Outage"},
    )
    operation = BulkOperation.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/console/bulk/{operation.id}/"
    assert outcomes(operation) == {str(mine.id): Outcome.APPLIED}
    assert Task.objects.get(pk=theirs.id).state == State.READY
    other = Client()
    other.force_login(outsider)
    assert other.get(f"/console/bulk/{operation.id}/").status_code == 404


def test_the_console_refuses_a_confirmation_without_a_reason(operator, acme):
    task = make_task(acme)
    client = Client()
    client.force_login(operator)
    response = client.post(
        "/console/bulk/new/", {"control": "cancel", "target": "selected", "ids": [task.id]}
    )
    assert response.status_code == 400 and b"A reason is required." in response.content
    assert not BulkOperation.objects.exists()


def test_a_large_operation_runs_in_the_worker_with_progress(
    operator, acme, monkeypatch, settings, django_capture_on_commit_callbacks
):
    settings.BULK_SYNC_LIMIT = 3
    monkeypatch.setattr(bulk, "CHUNK", 2)
    rung: list[str] = []
    monkeypatch.setattr(bulk, "ring", lambda operation_id: rung.append(str(operation_id)))
    tasks = [make_task(acme, objective=f"Refund {n}") for n in range(5)]
    client = Client()
    client.force_login(operator)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            "/console/bulk/new/",
            {
                "control": "escalate",
                "target": "all",
                "q": "Refund",
                "reason": "Backlog",
                "escalate_to": "admin",
            },
        )
    operation = BulkOperation.objects.get()
    assert rung == [str(operation.id)] and operation.status == BulkStatus.QUEUED  # not run in the request

    assert bulk.run_pending("worker-1", budget=2) == 2  # run_worker's loop: one budget per round
    operation.refresh_from_db()
    assert (operation.status, operation.done, operation.total) == (BulkStatus.RUNNING, 2, 5)
    page = client.get(f"/console/bulk/{operation.id}/").content.decode()
    assert "2 of 5" in page and 'http-equiv="refresh"' in page

    assert bulk.bulk_run(operation.id, runner="someone-else").done == 2  # held by worker-1: hands off
    assert bulk_run_task(str(operation.id)) in ("running", "done")  # the Celery entry point
    bulk.run_pending("worker-1")
    operation.refresh_from_db()
    assert (operation.status, operation.applied) == (BulkStatus.DONE, 5)
    assert all(task.escalation_level == 1 for task in Task.objects.all())
    assert len(tasks) == 5
