"""Failover while tasks are mid-flight, with real processes on PostgreSQL.

Region r1's ``manage.py run_worker --region r1`` processes work on slow tasks
(``MODEL_LATENCY_MS``) and keep running through the whole test: a partitioned
old region that never hears it lost its tasks. ``manage.py failover --from r1
--to r2`` runs as a process of its own while they hold leases and are in the
middle of model turns; then r2's workers finish the tasks. What must hold:
every task completes, no task is advanced by both regions (after its failover
event, no commit of any task came from an r1 worker), no step committed twice,
every audit chain verifies, and killing the old region's workers afterwards
(SIGKILL) changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from audit.verify import verify_task
from tasks.models import Lease, Task
from tasks.states import State, Trigger
from tests.conftest import make_task
from tests.workflow import ROOT, WorkerProcess, database_url, put_order, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(150)]
TASKS = 10
# Slow enough that r1 is still in the middle of most tasks when the failover commits; INFO, so that its
# workers' refusals ("discarded a stale decision") can be read back.
OLD_REGION = {"MODEL_LATENCY_MS": "2000", "LOG_LEVEL": "INFO"}


def lookups(tenant) -> list[Task]:
    tasks = []
    for n in range(TASKS):
        put_order(f"F-{n}")
        tasks.append(
            make_task(
                tenant,
                task_type="order_lookup",
                objective=f"Look up F-{n}",
                input={"order_id": f"F-{n}"},
                region="r1",
            )
        )
    return tasks


def actors(processes: list[WorkerProcess]) -> set[str]:
    """The audit actor ids of these worker processes (``worker:<host>:<pid>``, ``runtime.workers``)."""
    ids = set(
        TransitionEvent.objects.filter(actor_id__startswith="worker:").values_list("actor_id", flat=True)
    )
    pids = {f":{worker.process.pid}" for worker in processes}
    return {actor for actor in ids if any(actor.endswith(pid) for pid in pids)}


def mid_flight(tasks: list[Task]) -> bool:
    """Some task has committed a step in r1 and is still held there, and many have not started yet (so the
    failover surely finds work left, however slow the machine)."""
    ids = [t.pk for t in tasks]
    progressed = Task.objects.filter(pk__in=ids, state_version__gte=2).exclude(state=State.COMPLETED).exists()
    held = Lease.objects.filter(task_id__in=ids, expires_at__gt=timezone.now()).exists()
    return progressed and held and Task.objects.filter(pk__in=ids, state_version=1).count() >= TASKS // 2


def run_failover() -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", "failover", "--from", "r1", "--to", "r2", "--reason", "r1 partitioned"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": "memory://"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def all_completed(tasks: list[Task]) -> bool:
    return Task.objects.filter(pk__in=[t.pk for t in tasks], state=State.COMPLETED).count() == len(tasks)


def test_failover_mid_flight_no_task_is_advanced_by_both_regions(acme, workers):
    tasks = lookups(acme)
    # A lease far longer than the test's failover: the old region's leases never lapse by themselves,
    # it is the failover that takes the tasks away from workers that still believe they hold them.
    old = [
        workers(lease_ttl=30, extra_env=OLD_REGION, args=("--region", "r1", "--concurrency", "1"))
        for _ in "ab"
    ]
    wait_for(lambda: mid_flight(tasks), timeout=40, what="tasks mid-flight in r1")

    # Order lookups send nothing, so no action can be in doubt: everything unfinished verifies and moves.
    run = run_failover()
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1].endswith(", 0 blocked")  # (skipped: ended in r1 while being moved)
    failovers = TransitionEvent.objects.filter(task__in=tasks, trigger=Trigger.FAILOVER)
    assert failovers.exists()
    # Some task moved in the middle of its work (a step already committed in r1), not only untouched ones.
    assert failovers.filter(state_version__gt=2).exists()

    new = [workers(lease_ttl=30, args=("--region", "r2", "--concurrency", str(TASKS)))]
    wait_for(lambda: all_completed(tasks), timeout=60, what="r2 to finish every task")
    assert all(worker.process.poll() is None for worker in old)  # the old region kept running throughout

    r1, r2 = actors(old), actors(new)
    assert r1 and r2 and not r1 & r2
    for task in tasks:
        events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
        moved = [e.state_version for e in events if e.trigger == Trigger.FAILOVER]
        if moved:  # advanced by one region at a time: r1 up to the failover, r2 after it
            assert len(moved) == 1
            before = {e.actor_id for e in events if e.state_version < moved[0]}
            after = {e.actor_id for e in events if e.state_version > moved[0]}
            assert not after & r1, f"an r1 worker committed to {task.id} after its failover"
            assert after <= r2 and not before & r2
        # start + three steps, plus the failover if it moved: a step refused in r1 was not committed twice
        assert len(events) == 4 + len(moved)
        assert Task.objects.get(pk=task.pk).region == ("r2" if moved else "r1")

    # The partitioned old region dies for good: nothing it held comes back, nothing changes.
    for worker in old:
        worker.kill()
    # Its slots that were in a model turn at the failover tried to commit it, and were told why not.
    said = "".join(worker.process.stdout.read() for worker in old)
    assert (
        "failed over: it is owned by region 'r2' at epoch 2, this write was for region 'r1' at epoch 1"
        in said
    )
    for task in tasks:
        stored = Task.objects.get(pk=task.pk)
        assert stored.state == State.COMPLETED
        assert TransitionEvent.objects.filter(task=task).count() == stored.state_version
        assert verify_task(stored) is None
    assert not Lease.objects.filter(task__in=tasks, expires_at__gt=timezone.now()).exists()  # all given back
