"""The periodic sweep (``runtime.sweep``): the reason losing every broker message loses no work.

Overdue waits move on (a retry wait to resume validation, any other wait to
expiry or revalidation as its task type says), tasks past their own deadline
expire, and every runnable task without a live lease rings the doorbell again.
Each move is an ordinary transition at the version read: a task moved by
someone else in the meantime is skipped, never overwritten. Tasks are put in
place with ``advance``; the doorbell is a list the test reads.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import TransitionEvent
from runtime import sweep
from tasks import leases, registry
from tasks.models import Lease, Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
WORKER = Actor.worker("w")
OPERATOR = Actor(ActorKind.OPERATOR, "user:op")


class Doorbell(list):
    """Records each ring as (task id, region)."""

    def __call__(self, task_id, region) -> None:
        self.append((task_id, region))


def waiting(tenant, state: State, trigger: Trigger, *, wait: timedelta = timedelta(minutes=5), **overrides):
    task = make_task(tenant, **overrides)
    return advance(
        task.id, task.state_version, state, actor=WORKER, trigger=trigger, wait_deadline=timezone.now() + wait
    )


def waiting_for_input(tenant, **overrides) -> Task:
    return waiting(tenant, State.WAITING_INPUT, Trigger.REQUEST_INPUT, **overrides)


def waiting_to_retry(tenant, **overrides) -> Task:
    return waiting(tenant, State.WAITING_RETRY, Trigger.ATTEMPT_FAILED, **overrides)


def last_event(task: Task) -> TransitionEvent:
    return TransitionEvent.objects.filter(task=task).latest("state_version")


def past(task: Task) -> datetime:
    return task.wait_deadline + timedelta(seconds=1)


def test_a_retry_wait_whose_backoff_ended_goes_to_resume_validation_and_rings(acme):
    task = waiting_to_retry(acme)
    doorbell = Doorbell()
    report = sweep.sweep(doorbell, now=past(task))
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.wait_deadline) == (State.RESUME_VALIDATION, None)
    assert (last_event(task).trigger, last_event(task).actor_id) == (Trigger.BACKOFF_ELAPSED, "system:sweep")
    assert (report.waits_ended, report.expired) == (1, 0)
    assert doorbell == [(task.id, "default")]


def test_a_wait_before_its_deadline_is_left_alone(acme):
    retrying, asking = waiting_to_retry(acme), waiting_for_input(acme)
    report = sweep.sweep(Doorbell(), now=retrying.wait_deadline - timedelta(seconds=1))
    assert (report.waits_ended, report.expired, report.rung) == (0, 0, 0)
    assert Task.objects.get(pk=retrying.pk).state_version == retrying.state_version
    assert Task.objects.get(pk=asking.pk).state_version == asking.state_version


def test_a_wait_past_its_deadline_expires_through_the_sweep(acme):
    task = waiting_for_input(acme)
    report = sweep.sweep(Doorbell(), now=past(task))
    task = Task.objects.get(pk=task.pk)
    assert report.expired == 1
    assert (task.state, task.state_reason) == (State.EXPIRED, Trigger.WAIT_EXPIRED)
    assert task.outcome == {"reason": "wait_expired", "waited_in": State.WAITING_INPUT}
    assert last_event(task).trigger == "wait_expired"


def test_an_overdue_wait_of_a_type_that_revalidates_goes_to_resume_validation(acme, monkeypatch):
    kind = dataclasses.replace(registry.get("refund_request"), on_wait_expiry="revalidate")
    monkeypatch.setitem(registry._REGISTRY, "refund_request", kind)
    task = waiting_for_input(acme)
    report = sweep.sweep(Doorbell(), now=past(task))
    task = Task.objects.get(pk=task.pk)
    assert (task.state, last_event(task).trigger) == (State.RESUME_VALIDATION, Trigger.WAIT_EXPIRED)
    assert (report.waits_ended, report.expired) == (1, 0)


def test_an_overdue_wait_of_a_type_this_deployment_no_longer_has_is_revalidated_not_expired(
    acme, monkeypatch
):
    task = waiting_for_input(acme)
    monkeypatch.delitem(registry._REGISTRY, "refund_request")
    sweep.sweep(Doorbell(), now=past(task))
    assert Task.objects.get(pk=task.pk).state == State.RESUME_VALIDATION


@pytest.mark.parametrize("state", [State.READY, State.WAITING_INPUT])
def test_a_task_past_its_own_deadline_expires(acme, state):
    deadline = timezone.now() + timedelta(days=1)
    if state == State.READY:
        task = make_task(acme, deadline=deadline)
    else:  # the wait itself would last longer than the task may
        task = waiting_for_input(acme, deadline=deadline, wait=timedelta(days=2))
    report = sweep.sweep(Doorbell(), now=task.deadline + timedelta(seconds=1))
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason, task.outcome) == (
        State.EXPIRED,
        Trigger.DEADLINE_PASSED,
        {"reason": "deadline_passed"},
    )
    assert report.expired == 1


def test_a_quarantined_task_past_its_deadline_waits_for_an_operator_instead_of_expiring(acme):
    task = make_task(acme, deadline=timezone.now() + timedelta(days=1))
    task = advance(task.id, task.state_version, State.QUARANTINED, actor=WORKER, trigger=Trigger.QUARANTINE)
    report = sweep.sweep(Doorbell(), now=task.deadline + timedelta(seconds=1))
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED
    assert report.expired == 0


def test_only_runnable_tasks_of_its_region_without_a_live_lease_ring_again(acme):
    unleased = make_task(acme)
    make_task(acme, region="eu")  # eu's own sweep rings for it
    leased = make_task(acme)
    assert leases.claim(leased.id, worker_id="busy", region="default") is not None
    lapsed = make_task(acme)
    assert leases.claim(lapsed.id, worker_id="dead", region="default", ttl=timedelta(seconds=-1)) is not None
    waiting_for_input(acme)
    quarantined = make_task(acme)
    advance(quarantined.id, 1, State.QUARANTINED, actor=WORKER, trigger=Trigger.QUARANTINE)

    doorbell = Doorbell()
    report = sweep.sweep(doorbell)
    assert sorted(doorbell) == sorted([(unleased.id, "default"), (lapsed.id, "default")])
    assert report.rung == 2


def test_the_region_is_the_sweeps_own_for_the_doorbell_too(acme):
    mine, theirs = make_task(acme, region="eu"), make_task(acme)
    doorbell = Doorbell()
    report = sweep.sweep(doorbell, region="eu")
    assert (doorbell, report.rung) == ([(mine.id, "eu")], 1)
    assert theirs.id not in {task_id for task_id, _ in doorbell}


def test_without_a_doorbell_the_eligible_tasks_are_not_even_read(acme):
    """A polling worker's sweep (``run_worker --sweep``) passes no ring: nothing would hear it."""
    make_task(acme)
    with CaptureQueriesContext(connection) as with_ring:
        sweep.sweep(Doorbell())
    with CaptureQueriesContext(connection) as without:
        report = sweep.sweep(None)
    assert report.rung == 0
    lease_table = Lease._meta.db_table
    assert [q for q in with_ring.captured_queries if lease_table in q["sql"]]  # the eligible-task query
    assert not [q for q in without.captured_queries if lease_table in q["sql"]]
    assert len(without.captured_queries) == len(with_ring.captured_queries) - 1


def test_the_eligible_task_query_can_walk_the_claims_index(acme):
    """Region first, then age: the ``task_runnable`` partial index, not a scan of every runnable task."""
    make_task(acme)
    with CaptureQueriesContext(connection) as captured:
        sweep.ring_for_eligible(timezone.now(), Doorbell(), sweep.SweepReport(), "default")
    (query,) = captured.captured_queries
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a handful of rows would be scanned anyway
        cursor.execute(f"EXPLAIN {query['sql']}")
        plan = "\n".join(line for (line,) in cursor.fetchall())
    assert "task_runnable" in plan, plan
