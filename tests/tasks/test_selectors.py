"""The stuck-task detector: tasks with no valid next event coming."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tasks import leases
from tasks.models import Task
from tasks.selectors import stuck_condition
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
LONG_AGO = timedelta(minutes=30)


def age(task: Task, by: timedelta = LONG_AGO) -> None:
    Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - by)


def stuck_ids() -> set:
    return set(Task.objects.filter(stuck_condition(timezone.now())).values_list("id", flat=True))


def test_a_runnable_task_nobody_leased_for_long_is_stuck(acme):
    task = make_task(acme)
    assert task.id not in stuck_ids()  # just created: a worker may still come
    age(task)
    assert task.id in stuck_ids()


def test_a_runnable_task_with_a_working_worker_is_not_stuck(acme):
    task = make_task(acme)
    age(task)
    leases.claim(task.id, worker_id="w", region="default")
    assert task.id not in stuck_ids()


def test_a_wait_before_its_deadline_is_not_stuck_but_one_long_past_it_is(acme):
    task = make_task(acme)
    task = advance(
        task.id,
        1,
        State.WAITING_INPUT,
        actor=Actor.worker("w"),
        trigger=Trigger.REQUEST_INPUT,
        wait_deadline=timezone.now() + timedelta(days=3),
    )
    age(task, timedelta(days=2))
    assert task.id not in stuck_ids()  # a long wait is legitimate
    Task.objects.filter(pk=task.pk).update(wait_deadline=timezone.now() - LONG_AGO)
    assert task.id in stuck_ids()


def test_an_outcome_unknown_for_too_long_is_stuck(acme, settings):
    task = make_task(acme)
    advance(task.id, 1, State.OUTCOME_UNKNOWN, actor=Actor.worker("w"), trigger=Trigger.DISPATCH_UNKNOWN)
    assert task.id not in stuck_ids()
    age(task, timedelta(seconds=settings.UNKNOWN_OUTCOME_ESCALATE_AFTER + 60))
    assert task.id in stuck_ids()
