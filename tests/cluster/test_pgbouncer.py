"""Behind PgBouncer in transaction mode: every invoice paid once, a dead worker's tasks taken over at once.

``make cluster-test`` (marker ``cluster``). A real PgBouncer
(``tests.cluster.pgbouncer``: ``pool_mode = transaction``, 10 server sessions)
in front of this test's database; the API under gunicorn and three
``run_worker`` processes reach the database through it
(``DATABASE_POOLER=transaction``), while each worker's liveness lock has its
own session straight to PostgreSQL (``DATABASE_LIVENESS_URL``). The payment
system is the sandbox, in this test's process, every payment taking 300 ms.

1. A client creates ``PGBOUNCER_TASKS`` invoices (200) through the API; the
   workers start paying them.
2. While they run, PgBouncer's own list of clients shows the workers and the
   API on it, and no liveness session; PostgreSQL shows one liveness session
   per worker.
3. Once a quarter are paid, a worker holding a lease is SIGKILLed.

What must hold: each invoice paid exactly once; every task completed on its
payment; each task the dead worker held taken over by a survivor, on the
record, and before its lease expired (leases here last 30 s): the dead
worker's lock vanished with its direct session, which a lock left behind on a
pooled session would not have done.
"""

from __future__ import annotations

import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Iterator

import pytest
from django.db import connection

from audit.models import LeaseTakeover
from demo.sandbox.models import Effect, Fault
from tasks import liveness
from tasks.models import Task
from tasks.states import State
from tenancy.models import Scope
from tenancy.services import token_create
from tests.chaos.test_standby_failover import WORKER_ENV, Fleet, _drain
from tests.cluster import pgbouncer
from tests.cluster.test_failover import LIVE_LEASES, ClusterApi
from tests.workflow import WorkerProcess, database_url, sessions_named, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

TASKS = int(os.environ.get("PGBOUNCER_TASKS", "200"))
WORKERS, CONCURRENCY = 3, 4
LEASE_TTL = 30.0  # long: a takeover before a lease expires is the liveness lock's doing


@pytest.fixture
def bouncer() -> Iterator[pgbouncer.Bouncer]:
    if not pgbouncer.available():
        pytest.skip("pgbouncer is not installed: scripts/ensure-cluster-packages (make cluster-test does)")
    made = pgbouncer.Bouncer()
    try:
        yield made
    finally:
        made.stop()


class PooledFleet(Fleet):
    """``Fleet``'s workers with long leases (they inherit the pooler's settings from the environment)."""

    def start(self, count: int, concurrency: int) -> None:
        for _ in range(count):
            worker = WorkerProcess(
                self.sandbox,
                self.tmp_path,
                lease_ttl=LEASE_TTL,
                extra_env={**WORKER_ENV, "DATABASE_URL": self.url},
                args=("--concurrency", str(concurrency)),
            )
            lines = self.output.setdefault(worker.process.pid, [])
            threading.Thread(target=_drain, args=(worker.process, lines), daemon=True).start()
            self.started.append(worker)


def invoice(n: int) -> dict:
    """Invoice ``n``: a cent more each, all within the token's daily limit, so none waits for an approver."""
    return {
        "task_type": "pay_invoice",
        "objective": f"Pay INV-PB-{n:04d}",
        "input": {"invoice_id": f"INV-PB-{n:04d}", "amount": f"{1 + n / 100:.2f}", "currency": "EUR"},
        "idempotency_key": f"client-order-pb-{n:04d}/pay",
    }


def paid() -> Counter[str]:
    return Counter(e.request.get("invoice") for e in Effect.objects.filter(system="payments"))


def live_leases() -> list[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(LIVE_LEASES)
        return [(task, worker) for task, worker in cursor.fetchall()]


@pytest.mark.timeout(900)
def test_workers_behind_pgbouncer_pay_once_and_take_over_a_dead_worker_at_once(
    operator, sandbox, bouncer, tmp_path, monkeypatch
):
    _, token = token_create(operator, scopes=[Scope.INTEGRATE, Scope.READ], expires_at=None)
    name = connection.settings_dict["NAME"]
    pooled = bouncer.url(name)
    # Every process this test starts: through the pooler, the liveness lock direct.
    monkeypatch.setenv("DATABASE_POOLER", "transaction")
    monkeypatch.setenv("DATABASE_LIVENESS_URL", database_url())
    Fault.objects.create(
        system="payments", operation="dispatch", kind="latency", remaining=100_000, params={"ms": 300}
    )
    fleet = PooledFleet(sandbox, tmp_path, pooled)
    api: ClusterApi | None = None
    bodies = [invoice(n) for n in range(TASKS)]
    try:
        api = ClusterApi(pooled, token, tmp_path / "api.log")
        for body in bodies:
            assert api.create(body).status_code == 201
        fleet.start(WORKERS, CONCURRENCY)
        wait_for(lambda: sessions_named(liveness.APPLICATION_NAME) >= WORKERS or fleet.dead(), timeout=120,
                 what="every worker to hold its liveness lock")  # fmt: skip
        wait_for(lambda: len(paid()) >= TASKS // 4 or fleet.dead(), timeout=300, what="a quarter paid")
        assert not fleet.dead(), fleet.dead()

        # The pooler carries the workers' and the API's queries, never a liveness session: those are
        # PostgreSQL's own, one per worker.
        clients = [c for c in bouncer.admin("SHOW CLIENTS") if c.get("database") == name]
        assert len(clients) > WORKERS, clients
        assert not [c for c in clients if c.get("application_name") == liveness.APPLICATION_NAME]
        assert sessions_named(liveness.APPLICATION_NAME) == WORKERS

        victim = fleet.started[0]
        victim_id = f"{socket.gethostname()}:{victim.process.pid}"  # runtime.workers.worker_id
        wait_for(lambda: any(w == victim_id for _, w in live_leases()), timeout=60,
                 what="the victim to hold a lease")  # fmt: skip
        held = {task for task, worker in live_leases() if worker == victim_id}
        victim.kill()

        def finished() -> bool:
            return not Task.objects.exclude(state=State.COMPLETED).exists()

        wait_for(lambda: finished() or [d for d in fleet.dead() if f"pid {victim.process.pid} " not in d],
                 timeout=480, what="every task completed")  # fmt: skip
        survivors_dead = [d for d in fleet.dead() if f"pid {victim.process.pid} " not in d]
        assert not survivors_dead, survivors_dead
        pool = next(p for p in bouncer.admin("SHOW POOLS") if p["database"] == name)
    finally:
        fleet.stop()
        if api is not None:
            api.stop()

    payments = paid()
    assert {inv: n for inv, n in payments.items() if n != 1} == {}, "an invoice paid twice"
    assert set(payments) == {b["input"]["invoice_id"] for b in bodies}, "an invoice never paid"
    refs = {e.request["invoice"]: str(e.pk) for e in Effect.objects.filter(system="payments")}
    tasks = {t.idempotency_key: t for t in Task.objects.all()}
    assert set(tasks) == {b["idempotency_key"] for b in bodies}
    for body in bodies:
        task = tasks[body["idempotency_key"]]
        assert task.state == State.COMPLETED, (task.idempotency_key, task.state)
        assert task.outcome["payment_ref"] == refs[body["input"]["invoice_id"]], task.idempotency_key
    taken = LeaseTakeover.objects.filter(previous_worker_id=victim_id)
    assert held, "the worker killed held no lease"
    assert held <= {str(t.task_id) for t in taken}, "a task of the dead worker was never taken over"
    late = [(str(t.task_id), t.taken_at, t.previous_expires_at) for t in taken
            if t.taken_at >= t.previous_expires_at]  # fmt: skip
    assert late == [], "taken over only when the lease expired: the dead worker's lock outlived it"
    sessions = int(pool["sv_idle"]) + int(pool["sv_active"])
    shown = {"tasks": TASKS, "takeovers": taken.count(), "clients": int(pool["cl_active"]),
             "server_sessions": sessions, "max_wait_s": int(pool["maxwait"])}  # fmt: skip
    print(f"\npgbouncer: {json.dumps(shown, default=str)}")
