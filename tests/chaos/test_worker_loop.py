"""One worker process, many tasks in flight: slots, the heartbeat thread, the pool, draining.

Real ``manage.py run_worker`` processes against the test database and the
sandbox over HTTP, with the scripted model made slow (``MODEL_LATENCY_MS``),
as a model turn is in production. What is checked is what operators rely on:
that a process keeps several tasks going at once, that a model turn longer
than the lease's TTL does not lose the task to another worker, that the
slots share a bounded number of database sessions, and that SIGTERM gives
the tasks in hand back instead of stranding them.
"""

from __future__ import annotations

import signal
import time

import pytest
from django.utils import timezone

from audit.models import LeaseTakeover, TransitionEvent
from runtime import db
from tasks.models import Lease, Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import put_order, sessions_named, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def lookups(tenant, count: int) -> list[Task]:
    tasks = []
    for n in range(count):
        put_order(f"L-{n}")
        tasks.append(
            make_task(
                tenant, task_type="order_lookup", objective=f"Look up L-{n}", input={"order_id": f"L-{n}"}
            )
        )
    return tasks


def held_by(worker) -> int:
    """Live leases held by ``worker``'s process right now."""
    return Lease.objects.filter(
        worker_id__endswith=f":{worker.process.pid}", expires_at__gt=timezone.now()
    ).count()


def all_completed(tasks: list[Task]) -> bool:
    return Task.objects.filter(pk__in=[t.pk for t in tasks], state=State.COMPLETED).count() == len(tasks)


def test_one_process_keeps_many_tasks_in_flight_on_a_few_connections(acme, workers):
    tasks = lookups(acme, 12)
    worker = workers(
        lease_ttl=5,
        extra_env={"MODEL_LATENCY_MS": "1500"},
        args=("--concurrency", "12", "--db-connections", "3"),
    )
    most_held = most_sessions = 0
    deadline = time.monotonic() + 60
    while not all_completed(tasks) and time.monotonic() < deadline:
        most_held, most_sessions = (
            max(most_held, held_by(worker)),
            max(most_sessions, sessions_named(db.APPLICATION_NAME)),
        )
        time.sleep(0.05)
    assert all_completed(tasks)
    assert most_held >= 8, f"at most {most_held} tasks in flight at once"  # slow turns overlap, not queue
    assert 1 <= most_sessions <= 3, f"{most_sessions} database sessions for 12 slots"
    for task in tasks:  # start + three steps each: no step ran twice
        assert TransitionEvent.objects.filter(task=task).count() == 4


def test_a_model_turn_longer_than_the_lease_keeps_the_task(acme, workers):
    [task] = lookups(acme, 1)
    slow = {"MODEL_LATENCY_MS": "3000"}  # three TTLs
    first = workers(lease_ttl=1, extra_env=slow, args=("--concurrency", "2"))
    wait_for(lambda: held_by(first), what="the first worker's claim")
    rival = workers(lease_ttl=1, extra_env=slow, args=("--concurrency", "2"))  # would take a lapsed lease
    wait_for(lambda: all_completed([task]), timeout=30, what="completion")
    assert not LeaseTakeover.objects.filter(task=task).exists()  # the heartbeat thread kept it alive
    assert set(
        TransitionEvent.objects.filter(task=task, state_version__gt=1).values_list("actor_id", flat=True)
    ) == {f"worker:{Lease.objects.get(task=task).worker_id}"}
    assert rival.process.poll() is None


def test_sigterm_gives_the_tasks_in_hand_back_and_another_worker_finishes_them(acme, workers):
    tasks = lookups(acme, 4)
    first = workers(lease_ttl=30, extra_env={"MODEL_LATENCY_MS": "2000"}, args=("--concurrency", "4"))
    wait_for(lambda: held_by(first) == 4, what="all four tasks in hand")
    first.process.send_signal(signal.SIGTERM)
    assert first.process.wait(timeout=20) == 0  # each slot finished its model turn, then stopped
    now = timezone.now()
    unfinished = [t for t in tasks if Task.objects.get(pk=t.pk).state != State.COMPLETED]
    assert unfinished  # stopped between steps, not run to the end
    for task in unfinished:  # given back, not left to lapse after 30 s
        lease = Lease.objects.get(task=task)
        assert lease.expires_at <= now and lease.heartbeat_at == lease.expires_at
    second = workers(lease_ttl=30, args=("--concurrency", "4"))
    wait_for(lambda: all_completed(tasks), timeout=30, what="the second worker to finish them")
    assert not LeaseTakeover.objects.filter(task__in=tasks).exists()  # released, so no takeover
    for task in tasks:
        assert TransitionEvent.objects.filter(task=task).count() == 4
    second.stop()
