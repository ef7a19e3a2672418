"""Child tasks: started with the parent's wait, waited for, reported to the parent, canceled with it.

In-process resume loops against the sandbox over real HTTP, on PostgreSQL.
"""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from runtime import controls, engine, sweep
from runtime.llm import default_model
from tasks import children, decisions, services
from tasks.exceptions import StaleVersion
from tasks.models import CancelRequest, ExternalEvent, Task
from tasks.states import State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    for order_id in ("O-1", "O-2", "O-3"):
        put_order(order_id)


def batch(tenant, *order_ids: str) -> Task:
    return make_task(
        tenant, task_type="order_batch", objective="Look up a batch", input={"order_ids": list(order_ids)}
    )


def kids(parent: Task) -> list[Task]:
    return list(Task.objects.filter(parent=parent).order_by("idempotency_key"))


def control(
    task: Task, user, control: str = "cancel", roles=frozenset({"operator"}), **options
) -> controls.ControlResult:
    task = Task.objects.get(pk=task.pk)
    return controls.task_control(
        task,
        control,
        user=user,
        roles=roles,
        expected_version=task.state_version,
        reason="no longer needed",
        **options,
    )


def test_a_parent_starts_its_children_with_its_wait_and_resumes_when_the_last_one_ends(acme):
    parent = run(batch(acme, "O-1", "O-2", "O-3"))
    assert parent.state == State.WAITING_CHILDREN and parent.wait_deadline is not None
    children = kids(parent)
    assert [c.input for c in children] == [{"order_id": f"O-{n}"} for n in (1, 2, 3)]
    assert all(c.parent_id == parent.id and c.region == parent.region for c in children)

    for child in children[:2]:
        assert run(child).state == State.COMPLETED
    assert Task.objects.get(pk=parent.pk).state == State.WAITING_CHILDREN  # one still running

    assert run(children[2]).state == State.COMPLETED
    parent = Task.objects.get(pk=parent.pk)
    assert (parent.state, parent.state_reason) == (State.RESUME_VALIDATION, "children_done")
    events = ExternalEvent.objects.filter(task=parent, event_type="child_ended").order_by("event_key")
    assert sorted(e.payload["state"] for e in events) == ["completed"] * 3
    assert {e.applied_version for e in events} == {parent.state_version}

    parent = run(parent)
    assert parent.state == State.COMPLETED
    assert parent.outcome["lookups_completed"] == 3 and parent.outcome["lookups_not_completed"] == 0
    assert parent.outcome["summary"] == "3 of 3 orders looked up"


def test_children_exist_only_if_the_parents_wait_commits(acme, operator):
    parent = batch(acme, "O-1", "O-2")
    point = services.task_resume_point(parent.id, actor=Actor.system("tests"))
    decision = engine.decide(point.task, point.checkpoint, model=default_model(), now=timezone.now())
    assert decision.to_state == State.WAITING_CHILDREN
    control(parent, operator, "escalate")  # the parent moves on meanwhile
    with pytest.raises(StaleVersion):
        decisions.commit(point.task, decision, actor=Actor.worker("late"))
    assert kids(parent) == []


def test_a_step_decided_again_never_starts_a_second_set_of_children(acme, admin_user):
    parent = run(batch(acme, "O-1", "O-2"))
    first = kids(parent)
    # The parent is sent back through its step: held by an operator, then released.
    control(parent, admin_user, "quarantine", roles=frozenset({"admin"}))
    control(parent, admin_user, "release", roles=frozenset({"admin"}))
    parent = run(Task.objects.get(pk=parent.pk))
    assert kids(parent) == first
    assert (parent.state, parent.state_reason) == (State.WAITING_CHILDREN, "")


def test_a_child_that_does_not_complete_is_counted_and_the_parent_goes_on(acme, operator):
    parent = run(batch(acme, "O-1", "MISSING"))
    found, missing = kids(parent)
    assert run(found).state == State.COMPLETED
    assert run(missing).state == State.FAILED  # no such order: evidence_missing
    parent = run(Task.objects.get(pk=parent.pk))
    assert parent.state == State.COMPLETED
    assert (parent.outcome["lookups_completed"], parent.outcome["lookups_not_completed"]) == (1, 1)


def test_the_sweep_wakes_a_parent_whose_last_child_ended_without_waking_it(acme):
    parent = run(batch(acme, "O-1"))
    [child] = kids(parent)
    # The child's worker died between its terminal commit and waking the parent.
    with mock.patch.object(children, "wake", return_value=False):
        assert run(child).state == State.COMPLETED
    assert Task.objects.get(pk=parent.pk).state == State.WAITING_CHILDREN
    report = sweep.sweep(lambda task_id, region: None)
    assert report.parents_woken == 1
    assert Task.objects.get(pk=parent.pk).state == State.RESUME_VALIDATION


def test_canceling_the_parent_cancels_its_running_children_and_reports_them(acme, operator):
    parent = run(batch(acme, "O-1", "O-2"))
    done, running = kids(parent)
    assert run(done).state == State.COMPLETED
    control(parent, operator)
    assert Task.objects.get(pk=running.pk).state == State.CANCEL_REQUESTED  # asked at once
    assert Task.objects.get(pk=done.pk).state == State.COMPLETED  # an ended child stays as it ended

    assert run(Task.objects.get(pk=parent.pk)).state == State.CANCEL_REQUESTED  # waits for its child
    assert run(running).state == State.CANCELED
    parent = run(Task.objects.get(pk=parent.pk))
    assert parent.state == State.CANCELED
    assert parent.outcome["children"] == [
        {"task": str(done.id), "state": "completed"},
        {"task": str(running.id), "state": "canceled"},
    ]
    assert CancelRequest.objects.get(task=parent).status == "applied"
    child_request = CancelRequest.objects.get(task=running)
    assert (child_request.scope, child_request.status, child_request.requested_by) == (
        "task",
        "applied",
        "system:parent-cancel",
    )


def test_canceling_only_the_children_lets_the_parent_go_on_with_what_they_ended_with(acme, operator):
    parent = run(batch(acme, "O-1", "O-2"))
    result = control(parent, operator, scope="children")
    assert result.applied and result.note == "asked 2 running child task(s) to cancel"
    assert Task.objects.get(pk=parent.pk).state == State.WAITING_CHILDREN  # the parent itself goes on
    for child in kids(parent):
        assert run(child).state == State.CANCELED
    parent = run(Task.objects.get(pk=parent.pk))
    assert parent.state == State.COMPLETED
    assert (parent.outcome["lookups_completed"], parent.outcome["lookups_not_completed"]) == (0, 2)


def test_a_parent_that_ends_without_a_cancel_still_stops_its_running_children(acme):
    parent = run(batch(acme, "O-1", "O-2"))
    later = Task.objects.get(pk=parent.pk).wait_deadline + timedelta(seconds=1)
    sweep.sweep(lambda task_id, region: None, now=later)  # the wait for the children expired
    assert Task.objects.get(pk=parent.pk).state == State.EXPIRED
    for child in kids(parent):
        assert child.state == State.CANCEL_REQUESTED
        assert CancelRequest.objects.get(task=child).reason == f"parent task {parent.id} ended expired"
        assert run(child).state == State.CANCELED
