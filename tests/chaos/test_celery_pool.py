"""The README's production path recovers on its own when Celery pool processes are SIGKILLed.

``celery -A config worker -Q region.<r>`` and ``celery -A config beat`` run
against a real broker: Redis (a key prefix of its own), and the embedded
filesystem broker used when ``CELERY_BROKER_URL`` is unset. Tasks are slowed
by a latency fault on the order system so that kills land mid-task. The worker
must keep executing: every task — those whose process died and those started
after — completes within seconds, not after the lease TTL or never.
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest
from django.utils import timezone

from demo.sandbox.models import Fault
from tasks.models import Lease, Task
from tasks.states import State
from tests.chaos.processes import CeleryCluster, CeleryProcess
from tests.conftest import make_task
from tests.workflow import put_order, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(150)]
KILLS = 4
# The production default: a lease left by a dead pool process would hold its task this long.
LEASE_TTL = 30.0
# After the last kill: the killed child's lease is given up, its doorbell requeued, the tasks run.
RECOVERED_WITHIN = 12.0


@pytest.fixture
def cluster(tmp_path, sandbox):
    started: list[CeleryCluster] = []

    def start(**env: str) -> CeleryCluster:
        cluster = CeleryCluster(
            tmp_path, env={"LEASE_TTL_SECONDS": str(LEASE_TTL), "SANDBOX_BASE_URL": sandbox, **env}
        )
        started.append(cluster)
        return cluster

    yield start
    for cluster in started:
        cluster.stop()


def lookups(tenant, count: int, *, region: str, label: str) -> list[Task]:
    return [
        make_task(
            tenant,
            task_type="order_lookup",
            objective=f"Look up L-1 ({label}.{index})",
            input={"order_id": "L-1"},
            region=region,
        )
        for index in range(count)
    ]


def child_in_the_middle_of_a_task(worker: CeleryProcess, spared: set) -> tuple[int, object] | None:
    """A live pool child holding a task's lease right now (lease worker ids are ``host:pid``).

    A task whose child was already killed once is spared: a doorbell that loses
    its process twice waits out the lease TTL on purpose (no crash loops).
    """
    children = set(worker.children())
    holders = Lease.objects.filter(expires_at__gt=timezone.now()).exclude(task_id__in=spared)
    for task_id, holder in holders.values_list("task_id", "worker_id"):
        pid = int(holder.rpartition(":")[2])
        if pid in children:
            return pid, task_id
    return None


def unfinished(tasks: list[Task]) -> list[tuple[str, str]]:
    return list(
        Task.objects.filter(pk__in=[t.pk for t in tasks])
        .exclude(state=State.COMPLETED)
        .values_list("objective", "state")
    )


def slow_order_reads() -> None:
    put_order("L-1")
    Fault.objects.create(
        system="orders", operation="read", kind="latency", remaining=10_000, params={"ms": 400}
    )


def wait_until_done(tasks: list[Task], worker: CeleryProcess) -> float:
    since = time.monotonic()
    while unfinished(tasks) and worker.running() and time.monotonic() - since < RECOVERED_WITHIN:
        time.sleep(0.2)
    return time.monotonic() - since


def test_celery_worker_on_redis_resumes_every_task_within_seconds_when_pool_children_are_killed_mid_task(
    acme, cluster
):
    slow_order_reads()
    celery = cluster()
    worker = celery.worker(concurrency=2)
    celery.beat()

    tasks: list[Task] = []
    killed: set[int] = set()
    spared: set = set()
    for round_ in range(KILLS):
        tasks += lookups(acme, 3, region=celery.region, label=f"round {round_}")
        victim, task_id = wait_for(
            lambda: child_in_the_middle_of_a_task(worker, spared),
            timeout=30,
            what=f"a pool child to take a task in hand (round {round_})",
        )
        os.kill(victim, signal.SIGKILL)
        killed.add(victim)
        spared.add(task_id)
    tasks += lookups(acme, 3, region=celery.region, label="after the kills")

    took = wait_until_done(tasks, worker)
    assert worker.running(), f"the Celery worker exited:\n{worker.output()[-5000:]}"
    assert not unfinished(tasks), (
        f"still unfinished {took:.1f}s after the last kill: {unfinished(tasks)}\n{worker.output()[-3000:]}"
    )
    assert killed.isdisjoint(worker.children()) and len(worker.children()) == 2, "children not replaced"


def test_celery_worker_on_the_embedded_broker_keeps_executing_when_its_pool_processes_are_killed(
    acme, cluster, tmp_path
):
    slow_order_reads()
    celery = cluster(CELERY_BROKER_URL="filesystem://", BROKER_DIR=str(tmp_path / "broker"))
    worker = celery.worker(concurrency=2)
    celery.beat()

    tasks: list[Task] = []
    for round_ in range(3 * KILLS):
        tasks += lookups(acme, 2, region=celery.region, label=f"round {round_}")
        time.sleep(random.uniform(0.2, 0.8))
        # Whatever pool processes the worker runs, kill one at a random moment: idle or mid-task.
        if children := worker.children():
            os.kill(random.choice(children), signal.SIGKILL)
    tasks += lookups(acme, 3, region=celery.region, label="after the kills")

    took = wait_until_done(tasks, worker)
    assert worker.running(), f"the Celery worker exited:\n{worker.output()[-5000:]}"
    assert not unfinished(tasks), (
        f"still unfinished {took:.1f}s after the last kill: {unfinished(tasks)}\n{worker.output()[-3000:]}"
    )
