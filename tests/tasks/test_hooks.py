"""The kernel's hook points: what runs after a task ends, in which order, and when."""

from __future__ import annotations

from unittest import mock

import pytest
from django.apps import apps
from django.db import connection

from tasks import cancellation, children, hooks
from tasks.exceptions import StaleVersion
from tasks.models import Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

WORKER = Actor(ActorKind.WORKER, "worker:tests")


def batch_child(tenant) -> Task:
    """A task that starts children of its own (``order_batch``), itself the child of another."""
    parent = make_task(tenant, objective="The parent")
    return make_task(
        tenant, task_type="order_batch", objective="A batch", input={"order_ids": ["O-1"]}, parent=parent
    )


def fail(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.FAILED,
        actor=WORKER,
        trigger=Trigger.FAIL,
        progress=progress("end"),
    )


def test_after_a_task_ends_its_parent_is_woken_then_its_children_are_canceled():
    assert hooks.after_task_ended.names() == ("tasks.children", "tasks.cancellation")


def test_the_hooks_of_a_point_run_in_the_order_they_were_registered():
    point: hooks.HookPoint[str] = hooks.HookPoint("test")
    ran: list[str] = []
    point.register("first", lambda subject: ran.append(f"first {subject}"))
    point.register("second", lambda subject: ran.append(f"second {subject}"))
    point.run("x")
    assert (point.names(), ran) == (("first", "second"), ["first x", "second x"])


def test_loading_the_tasks_app_again_registers_nothing_twice():
    apps.get_app_config("tasks").ready()
    assert hooks.after_task_ended.names() == ("tasks.children", "tasks.cancellation")


def test_another_hook_under_a_taken_name_is_refused():
    with pytest.raises(ValueError, match="already has a hook named 'tasks.children'"):
        hooks.after_task_ended.register("tasks.children", cancellation.after_parent_ended)
    assert hooks.after_task_ended.names() == ("tasks.children", "tasks.cancellation")


@pytest.mark.django_db(transaction=True)
def test_the_hooks_run_after_the_terminal_commit_in_order_with_the_task_as_committed(acme):
    task = batch_child(acme)
    seen: list[tuple[str, bool, str]] = []

    def woke(parent_id: object) -> bool:
        committed = Task.objects.get(pk=task.pk).state  # outside any transaction: what others see
        seen.append(("wake parent", connection.in_atomic_block, committed))
        return False

    def canceled(ended: Task, *, reason: str) -> list[object]:
        seen.append(("cancel children", connection.in_atomic_block, ended.state))
        return []

    with (
        mock.patch.object(children, "wake", side_effect=woke) as wake,
        mock.patch.object(cancellation, "cancel_children", side_effect=canceled),
    ):
        ended = fail(task)
    wake.assert_called_once_with(task.parent_id)
    assert seen == [("wake parent", False, State.FAILED), ("cancel children", False, State.FAILED)]
    assert ended.state_version == 2


@pytest.mark.django_db
def test_no_hook_runs_for_a_move_that_does_not_end_the_task_or_is_refused(acme):
    task = batch_child(acme)
    with mock.patch.object(hooks.after_task_ended, "run") as run:
        advance(task.id, 1, State.READY, actor=WORKER, trigger=Trigger.STEP, progress=progress("on"))
        with pytest.raises(StaleVersion):
            advance(task.id, 1, State.FAILED, actor=WORKER, trigger=Trigger.FAIL, progress=progress("end"))
    run.assert_not_called()
