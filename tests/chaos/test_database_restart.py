"""Workers ride through a database restart: they reconnect, never exit, and resume within seconds.

The shared PostgreSQL cluster is never restarted here (other tests run against
it). The workers reach it through ``PostgresProxy`` instead, and a "restart"
cuts every proxied connection at once, refuses new ones for five seconds, then
accepts again. Tasks are slowed by a latency fault on the order system so that
the cut lands while a task is in hand, its lease held.
"""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from demo.sandbox.models import Fault
from tasks.models import Lease, Task
from tasks.states import State
from tests.chaos.processes import CeleryCluster, PostgresProxy
from tests.conftest import make_task
from tests.workflow import put_order, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
DOWNTIME = 5.0
# Every task, including the one in hand when the connection died, must be done this soon after the
# database is back. A lease left behind by the cut would hold its task for LEASE_TTL (30 s) instead.
RECOVERED_WITHIN = 10.0
PRODUCTION_ENV = {"LEASE_TTL_SECONDS": "30"}


@pytest.fixture
def proxy():
    proxy = PostgresProxy()
    yield proxy
    proxy.close()


@pytest.fixture
def celery(tmp_path, sandbox, proxy):
    cluster = CeleryCluster(
        tmp_path,
        env={**PRODUCTION_ENV, "DATABASE_URL": proxy.database_url(), "SANDBOX_BASE_URL": sandbox},
    )
    yield cluster
    cluster.stop()


def lookups(tenant, count: int, *, region: str = "default") -> list[Task]:
    return [
        make_task(
            tenant,
            task_type="order_lookup",
            objective=f"Look up L-1 ({index})",
            input={"order_id": "L-1"},
            region=region,
        )
        for index in range(count)
    ]


def slow_order_reads() -> None:
    put_order("L-1")
    Fault.objects.create(
        system="orders", operation="read", kind="latency", remaining=10_000, params={"ms": 300}
    )


def a_lease_is_held() -> bool:
    return Lease.objects.filter(expires_at__gt=timezone.now()).exists()


def unfinished(tasks: list[Task]) -> list[tuple[str, str]]:
    return list(
        Task.objects.filter(pk__in=[t.pk for t in tasks])
        .exclude(state=State.COMPLETED)
        .values_list("objective", "state")
    )


def wait_until_done(tasks: list[Task], alive) -> float:
    """Seconds it took every task to complete (or for ``alive()`` to turn false), at most RECOVERED_WITHIN."""
    back = time.monotonic()
    while unfinished(tasks) and alive() and time.monotonic() - back < RECOVERED_WITHIN:
        time.sleep(0.1)
    return time.monotonic() - back


def restart_database_mid_task(proxy: PostgresProxy, tenant, *, region: str = "default") -> list[Task]:
    """Cut the database while a task is in hand; start more tasks during the outage; bring it back."""
    before = lookups(tenant, 3, region=region)
    wait_for(a_lease_is_held, timeout=30, what="a worker to take a task in hand")
    proxy.go_down()
    during = lookups(tenant, 3, region=region)  # the test's own connection goes around the proxy
    time.sleep(DOWNTIME)
    proxy.come_up()
    return before + during


def test_run_worker_reconnects_after_a_database_restart_and_finishes_every_task(acme, workers, proxy):
    slow_order_reads()
    worker = workers(lease_ttl=30, extra_env={**PRODUCTION_ENV, "DATABASE_URL": proxy.database_url()})
    tasks = restart_database_mid_task(proxy, acme)

    took = wait_until_done(tasks, alive=lambda: worker.process.poll() is None)
    assert worker.process.poll() is None, f"the worker exited:\n{worker.process.stdout.read()[-5000:]}"
    assert not unfinished(tasks), f"still unfinished {took:.1f}s after the database came back"
    assert proxy.refused, "the worker never tried to reconnect during the outage"


def test_celery_worker_and_beat_reconnect_after_a_database_restart_and_finish_every_task(acme, celery, proxy):
    slow_order_reads()
    worker = celery.worker()
    beat = celery.beat()
    tasks = restart_database_mid_task(proxy, acme, region=celery.region)

    took = wait_until_done(tasks, alive=worker.running)
    assert worker.running(), f"the Celery worker exited:\n{worker.output()[-5000:]}"
    assert beat.running(), f"beat exited:\n{beat.output()[-5000:]}"
    assert not unfinished(tasks), f"still unfinished {took:.1f}s after the database came back"
