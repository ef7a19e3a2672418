"""Leases on PostgreSQL: single claims under races, expiry, fencing, heartbeat, release, regions.

Races run in real threads, each with its own database connection, so the
tests that use them need ``transaction=True`` (committed rows other
connections can see) and close their connections when the thread ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from audit.models import TransitionEvent
from runtime import sweep
from tasks import leases
from tasks.exceptions import LeaseLost
from tasks.leases import Held
from tasks.models import Lease, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

REGION = "default"
# Short enough to let a lease lapse inside a test, long enough to claim and commit one step first.
SHORT_TTL = timedelta(milliseconds=300)


def lapse() -> None:
    """Sleep until a lease taken with ``SHORT_TTL`` has expired."""
    time.sleep(SHORT_TTL.total_seconds() + 0.1)


def claim(task: Task, worker: str, **kwargs: Any) -> Held | None:
    return leases.claim(task.id, worker_id=worker, region=kwargs.pop("region", REGION), **kwargs)


def at_once(workers: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(n)`` for n in 0..workers-1 in threads released together; return results in order.

    An exception inside a thread is returned as its result, so the test sees it.
    """
    barrier = threading.Barrier(workers)
    results: list[Any] = [None] * workers

    def run(n: int) -> None:
        try:
            barrier.wait()
            results[n] = work(n)
        except Exception as exc:
            results[n] = exc
        finally:
            connections.close_all()  # this thread's connection, not the test's

    threads = [threading.Thread(target=run, args=(n,)) for n in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def step(task: Task, lease: Held, *, version: int | None = None) -> Task:
    """One worker step on ``task`` (a ready→ready self-loop), fenced by ``lease``."""
    return advance(
        task.id,
        task.state_version if version is None else version,
        State.READY,
        actor=Actor.worker(lease.worker_id),
        trigger=Trigger.STEP,
        progress=progress("step"),
        lease=lease,
    )


# Claiming


@pytest.mark.django_db(transaction=True)
def test_two_workers_claiming_the_same_task_at_once_get_one_lease(acme):
    task = make_task(acme)

    results = at_once(2, lambda n: claim(task, f"w{n}"))

    assert connection.vendor == "postgresql"
    held = [result for result in results if isinstance(result, Held)]
    assert len(held) == 1, results
    assert results.count(None) == 1, results
    lease = Lease.objects.get(task=task)
    assert (lease.worker_id, lease.token) == (held[0].worker_id, 1)
    assert held[0].token == 1


@pytest.mark.django_db(transaction=True)
def test_four_workers_claiming_next_share_twenty_tasks_without_overlap(acme):
    tasks = {make_task(acme).id for _ in range(20)}

    def claim_until_empty(n: int) -> list[leases.Held]:
        # A claimer whose snapshot predates another's commit may lock a task just leased and then
        # find the lease live: it comes back short and claims again, as a worker's next poll would.
        held: list[leases.Held] = []
        while batch := leases.claim_next(worker_id=f"w{n}", region=REGION, limit=5):
            held += batch
        return held

    results = at_once(4, claim_until_empty)

    assert not [result for result in results if isinstance(result, Exception)], results
    claimed = [held.task_id for batch in results for held in batch]
    assert len(claimed) == len(set(claimed)), "a task was claimed twice"
    assert set(claimed) == tasks
    assert Lease.objects.filter(task_id__in=tasks, token=1).count() == 20
    for n, batch in enumerate(results):  # each lease row names the worker whose batch holds it
        assert {held.task_id for held in batch} == set(
            Lease.objects.filter(worker_id=f"w{n}").values_list("task_id", flat=True)
        )


def test_claim_refuses_a_task_whose_lease_is_live(acme):
    task = make_task(acme)
    first = claim(task, "w1")
    assert first is not None
    assert claim(task, "w2") is None
    assert leases.claim_next(worker_id="w2", region=REGION) == []
    assert Lease.objects.get(task=task).worker_id == "w1"


def test_an_expired_lease_lets_another_worker_claim_with_a_higher_token(acme):
    task = make_task(acme)
    first = claim(task, "w1", ttl=SHORT_TTL)
    assert first is not None and first.token == 1

    lapse()
    second = claim(task, "w2")

    assert second == Held(task.id, "w2", 2)
    lease = Lease.objects.get(task=task)
    assert (lease.worker_id, lease.token) == ("w2", 2)


def test_claim_next_takes_a_task_whose_lease_expired(acme):
    task = make_task(acme)
    claim(task, "w1", ttl=SHORT_TTL)
    lapse()
    assert leases.claim_next(worker_id="w2", region=REGION) == [Held(task.id, "w2", 2)]


def test_a_worker_of_one_region_does_not_claim_another_regions_task(acme):
    task = make_task(acme, region="eu")

    assert claim(task, "w-default", region="default") is None
    assert leases.claim_next(worker_id="w-default", region="default", limit=10) == []
    assert not Lease.objects.filter(task=task).exists()
    assert claim(task, "w-eu", region="eu") == Held(task.id, "w-eu", 1)  # its own region's worker may


# Fencing


def test_a_write_with_a_lease_taken_over_by_another_worker_raises_lease_lost_and_changes_nothing(acme):
    task = make_task(acme)
    old = claim(task, "w1", ttl=SHORT_TTL)
    lapse()
    new = claim(task, "w2")
    assert old is not None and new is not None and new.token > old.token
    events_before = TransitionEvent.objects.filter(task=task).count()

    with pytest.raises(LeaseLost):
        step(task, old)

    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, stored.audit_head) == (State.READY, 1, task.audit_head)
    assert TransitionEvent.objects.filter(task=task).count() == events_before


def test_a_write_with_a_lapsed_lease_nobody_reclaimed_raises_lease_lost(acme):
    task = make_task(acme)
    held = claim(task, "w1", ttl=SHORT_TTL)
    assert held is not None
    lapse()

    with pytest.raises(LeaseLost):
        step(task, held)

    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_write_with_the_current_lease_commits(acme):
    task = make_task(acme)
    old = claim(task, "w1", ttl=SHORT_TTL)
    lapse()
    new = claim(task, "w2")
    assert old is not None and new is not None

    moved = step(task, new)

    assert moved.state_version == 2
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert event.actor_id == "worker:w2"


# Lease expiry never changes business state


def test_a_lapsed_lease_leaves_a_waiting_task_as_it_was_and_unclaimable(acme):
    task = make_task(acme)
    held = claim(task, "w1", ttl=SHORT_TTL)
    assert held is not None
    wait_deadline = timezone.now() + timedelta(hours=1)
    waiting = advance(
        task.id,
        task.state_version,
        State.WAITING_INPUT,
        actor=Actor.worker("w1"),
        trigger=Trigger.REQUEST_INPUT,
        progress=progress("ask-customer"),
        lease=held,
        wait_deadline=wait_deadline,
    )

    lapse()
    rung: list[Any] = []
    sweep.sweep(lambda task_id, region: rung.append(task_id))  # what runs when nobody heartbeats

    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, stored.wait_deadline) == (
        State.WAITING_INPUT,
        waiting.state_version,
        wait_deadline,
    )
    assert task.id not in rung
    assert claim(task, "w2") is None  # waiting is not runnable, lease or no lease
    assert leases.claim_next(worker_id="w2", region=REGION) == []


# Heartbeat and release


def test_heartbeat_extends_a_live_lease(acme):
    task = make_task(acme)
    held = claim(task, "w1", ttl=SHORT_TTL)
    assert held is not None

    assert leases.heartbeat(held, ttl=timedelta(minutes=5)) is True

    assert Lease.objects.get(task=task).expires_at > timezone.now() + timedelta(minutes=4)
    lapse()  # past the original ttl: still held
    assert claim(task, "w2") is None


def test_heartbeat_returns_false_once_another_worker_took_the_lease(acme):
    task = make_task(acme)
    old = claim(task, "w1", ttl=SHORT_TTL)
    lapse()
    new = claim(task, "w2")
    assert old is not None and new is not None
    expires = Lease.objects.get(task=task).expires_at

    assert leases.heartbeat(old) is False

    lease = Lease.objects.get(task=task)
    assert (lease.worker_id, lease.token, lease.expires_at) == ("w2", new.token, expires)


def test_heartbeat_returns_false_once_the_lease_lapsed(acme):
    task = make_task(acme)
    held = claim(task, "w1", ttl=SHORT_TTL)
    assert held is not None
    lapse()
    assert leases.heartbeat(held) is False


def test_release_makes_the_task_claimable_at_once(acme):
    task = make_task(acme)
    held = claim(task, "w1")  # the default ttl: only release can free it within this test
    assert held is not None

    leases.release(held)

    assert claim(task, "w2") == Held(task.id, "w2", 2)


def test_a_release_with_a_hold_keeps_others_off_until_it_ends_and_is_no_lapse(acme):
    from tests.tasks.test_claim_statement import round_trips

    task = make_task(acme)
    held = claim(task, "w1")
    assert held is not None
    with round_trips() as trips:
        leases.release(held, hold=timedelta(hours=1))
    assert trips == [1]
    lease = Lease.objects.get(task=task)
    # Given up (both columns the same time), an hour from the database's now: not claimable till then.
    assert lease.heartbeat_at == lease.expires_at
    assert timedelta(minutes=59) < lease.expires_at - timezone.now() <= timedelta(hours=1)
    assert claim(task, "w2") is None
    leases.end_hold(task.id)
    assert claim(task, "w2") == Held(task.id, "w2", 2)


def test_a_release_with_a_stale_token_does_not_free_the_new_holders_lease(acme):
    task = make_task(acme)
    old = claim(task, "w1", ttl=SHORT_TTL)
    lapse()
    new = claim(task, "w2")
    assert old is not None and new is not None

    leases.release(old)

    assert claim(task, "w3") is None
    assert Lease.objects.get(task=task).worker_id == "w2"
