"""A pg_auto_failover primary dies mid-run: every invoice paid once, none lost, the takeovers on record.

``make cluster-test`` (marker ``cluster``, left out of ``make test``). A real
formation (``tests.cluster.autofailover``: monitor, primary, synchronous
secondary, each a server of its own on loopback); the API under gunicorn and
``run_worker`` processes all on one multi-host ``DATABASE_URL`` with
``target_session_attrs=read-write`` (no proxy, no virtual IP: libpq finds the
writer). The payment system is the sandbox on this test's database on the
shared cluster, whose records survive whatever happens to ours.

1. A client creates ``CLUSTER_TASKS`` invoices (200; each ``POST /api/tasks/``
   with its own key); then three workers start paying them, each payment
   taking 300 ms at the sandbox.
2. Once a quarter are paid, the primary's node is SIGKILLed (keeper and
   postmaster: the machine is gone) and so is one worker (it ran beside it).
   The monitor promotes the secondary. Meanwhile a client keeps asking the API:
   it may answer 503 with ``Retry-After``, never 500.
3. The two surviving workers are not restarted: they reconnect through the same
   URL to the new primary and finish the run, taking over the dead worker's
   tasks once their leases expire.

What must hold: each invoice paid exactly once at the payment system; every
acknowledged create on the new primary (synchronous replication loses no
acknowledged commit); every task completed on its one payment (or, had one
not finished, in an owned recovery state); the dead worker's takeovers in the
audit log; no surviving worker exited.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from demo.sandbox.models import Effect, Fault
from tasks.states import State
from tenancy.models import Scope
from tenancy.services import token_create
from tests.chaos.test_standby_failover import Api, Fleet, copy_schema
from tests.cluster import autofailover
from tests.workflow import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

TASKS = int(os.environ.get("CLUSTER_TASKS", "200"))
WORKERS, CONCURRENCY = 3, 4
# Leases held at a moment: live, and not given back (a release leaves heartbeat_at == expires_at).
LIVE_LEASES = (
    "SELECT task_id::text, worker_id FROM tasks_lease WHERE expires_at > now() AND heartbeat_at < expires_at"
)
RECOVERY_STATES = {State.WAITING_RETRY, State.READY}  # not finished, but a worker's to resume


@pytest.fixture
def formation() -> Iterator[autofailover.Formation]:
    if shutil.which("pg_autoctl") is None:
        pytest.skip("pg_autoctl is not installed: scripts/ensure-cluster-packages (make cluster-test does)")
    made = autofailover.create()
    try:
        yield made
    finally:
        made.destroy()


def tasks_on(port: int) -> dict[str, tuple[str, dict]]:
    rows = autofailover.query(port, "SELECT idempotency_key, state, outcome FROM tasks_task")
    return {key: (state, outcome if isinstance(outcome, dict) else json.loads(outcome or "{}"))
            for key, state, outcome in rows}  # fmt: skip


class ClusterApi(Api):
    """``Api``, given longer to boot: gunicorn on a machine shared with a formation and its workers."""

    def __init__(self, url: str, token: str, log: Path):
        try:
            super().__init__(url, token, log)
        except AssertionError:
            wait_for(self._answers, timeout=240, what="gunicorn to answer")


class Prober:
    """Asks the API all along (a list, as a dashboard would): every status it answered, by code."""

    def __init__(self, api: Api):
        self.api = api
        self.codes: Counter[int] = Counter()
        self.retry_after: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                response = self.api.http.get("/api/tasks/", params={"limit": 1})
            except httpx.TransportError:
                self.codes[0] += 1
            else:
                self.codes[response.status_code] += 1
                if response.status_code == 503:
                    self.retry_after.add(response.headers.get("Retry-After", ""))
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def invoice(n: int) -> dict:
    """The create of invoice ``n``: a cent more each, 200 of them within a token's day's limit (5,000 EUR:
    ``workflows.pay_invoice``), so none waits for an approver."""
    return {
        "task_type": "pay_invoice",
        "objective": f"Pay INV-HA-{n:04d}",
        "input": {"invoice_id": f"INV-HA-{n:04d}", "amount": f"{1 + n / 100:.2f}", "currency": "EUR"},
        "idempotency_key": f"client-order-ha-{n:04d}/pay",
    }


def figures(port: int, *, started: float, killed: float, stranded: set[str]) -> dict[str, float | int]:
    """What the failover cost (``started``: the workers' start), from the audit log on the new primary
    (wall-clock seconds, one machine):
    write unavailability (the primary's death to the first commit on the new one), the tasks stranded
    (held by a worker when it died) and the time until each has moved again, completions per second
    before, during (death until every stranded task moved) and after."""
    rows = autofailover.query(
        port,
        "SELECT task_id::text, to_state, extract(epoch FROM created_at)::float8 FROM audit_transitionevent",
    )
    after_death = [(task, at) for task, _, at in rows if at > killed]
    first_commit = min(at for _, at in after_death)
    # A stranded task moves again after the death (one whose last step committed just before has no event).
    moved = {task: min(at for t, at in after_death if t == task) for task in stranded
             if any(t == task for t, _ in after_death)}  # fmt: skip
    back = max(moved.values(), default=first_commit)
    done = sorted(at for _, state, at in rows if state == State.COMPLETED)
    end = done[-1]

    def rate(start: float, stop: float) -> float:
        return round(sum(start < at <= stop for at in done) / max(stop - start, 1e-9), 2)

    return {
        "tasks": TASKS,
        "write_unavailable_s": round(first_commit - killed, 2),
        "stranded": len(stranded),
        "all_back_in_progress_s": round(back - killed, 2),
        # From the first completion: the workers' start-up is not throughput lost.
        "tasks_per_s_before": rate(min([at for at in done if at > started], default=started) - 1e-6, killed),
        "tasks_per_s_during": rate(killed, back),
        "tasks_per_s_after": rate(back, end),
    }


def paid() -> Counter[str]:
    return Counter(e.request.get("invoice") for e in Effect.objects.filter(system="payments"))


@pytest.mark.timeout(900)
def test_a_primary_killed_mid_run_pays_nothing_twice_and_loses_nothing(
    operator, sandbox, formation, tmp_path
):
    primary = formation.writer()
    assert primary is not None
    _, token = token_create(operator, scopes=[Scope.INTEGRATE, Scope.READ], expires_at=None)
    copy_schema(SimpleNamespace(url=lambda db: f"postgres://postgres@127.0.0.1:{primary.port}/{db}"))
    url = formation.dsn()
    Fault.objects.create(
        system="payments", operation="dispatch", kind="latency", remaining=100_000, params={"ms": 300}
    )
    fleet = Fleet(sandbox, tmp_path, url)
    api: ClusterApi | None = None
    prober: Prober | None = None
    bodies = [invoice(n) for n in range(TASKS)]
    invoices = {b["input"]["invoice_id"] for b in bodies}
    try:
        api = ClusterApi(url, token, tmp_path / "api.log")
        for body in bodies:  # all created first: the failover lands mid-run, not mid-creation
            assert api.create(body).status_code == 201
        prober = Prober(api)
        started = time.time()
        fleet.start(WORKERS, CONCURRENCY)
        wait_for(lambda: len(paid()) >= TASKS // 4 or fleet.dead(), timeout=300, what="a quarter paid")
        assert not fleet.dead(), fleet.dead()

        # The primary's machine dies, with the worker that ran beside it.
        victim = fleet.started[0].process
        victim_id = f"{socket.gethostname()}:{victim.pid}"  # runtime.workers.worker_id
        # The moment: the worker beside the primary holds a lease (a step of its in flight).
        try:
            wait_for(lambda: any(w == victim_id for _, w in autofailover.query(primary.port, LIVE_LEASES)),
                     timeout=60, what="the worker beside the primary to hold a lease")  # fmt: skip
        except AssertionError:
            sql = "SELECT now(), worker_id, heartbeat_at, expires_at FROM tasks_lease ORDER BY 3 DESC LIMIT 9"
            rows = autofailover.query(primary.port, sql)
            raise AssertionError(f"victim {victim_id}; leases {rows}") from None
        held = autofailover.query(primary.port, LIVE_LEASES)
        states = dict(autofailover.query(primary.port, "SELECT state, count(*) FROM tasks_task GROUP BY 1"))
        killed_at, killed = time.time(), time.monotonic()
        primary.kill()
        victim.kill()
        victim.wait(timeout=30)
        formation.wait(lambda: (p := formation.writer()) is not None and p is not primary,
                       timeout=120, what="the secondary promoted")  # fmt: skip
        new = formation.writer()
        assert new is not None
        promoted = time.monotonic() - killed

        def finished() -> bool:
            return all(state == State.COMPLETED for state, _ in tasks_on(new.port).values())

        wait_for(lambda: finished() or [d for d in fleet.dead() if str(victim.pid) not in d],
                 timeout=480, what="every task completed on the new primary")  # fmt: skip
        survivors_dead = [d for d in fleet.dead() if f"pid {victim.pid} " not in d]
        assert not survivors_dead, survivors_dead
        prober.stop()
        after = tasks_on(new.port)
        taken = autofailover.query(
            new.port, "SELECT task_id::text, previous_worker_id FROM audit_leasetakeover"
        )
        takeovers = len(taken)
        cost = figures(new.port, started=started, killed=killed_at, stranded={row[0] for row in held})
        cost |= {"promoted_s": round(promoted, 2), "takeovers": takeovers, "api_answers": dict(prober.codes),
                 "states_at_death": states}  # fmt: skip
        print(f"\ncluster failover: {json.dumps(cost)}")
        if os.environ.get("CLUSTER_RESULTS"):  # make bench-cluster (bench/cluster.py)
            Path(os.environ["CLUSTER_RESULTS"]).write_text(json.dumps(cost, indent=2) + "\n")
    finally:
        if prober is not None:
            prober.stop()
        fleet.stop()
        if api is not None:
            api.stop()

    payments = paid()
    assert {inv: n for inv, n in payments.items() if n != 1} == {}, "an invoice paid twice"
    assert set(payments) == invoices, "an invoice never paid"
    assert set(after) == {b["idempotency_key"] for b in bodies}, "an acknowledged create was lost"
    refs = {e.request["invoice"]: str(e.pk) for e in Effect.objects.filter(system="payments")}
    for body in bodies:
        state, outcome = after[body["idempotency_key"]]
        assert state == State.COMPLETED or state in RECOVERY_STATES, (body["idempotency_key"], state)
        if state == State.COMPLETED:
            assert outcome["payment_ref"] == refs[body["input"]["invoice_id"]], body["idempotency_key"]
    assert prober.codes[500] == 0, f"the API answered 500 during the failover: {dict(prober.codes)}"
    assert prober.retry_after <= {"5"}
    # Each task the dead worker held was taken over by a survivor, and the takeover is on the record.
    orphaned = {task for task, worker in held if worker == victim_id}
    assert orphaned, f"the worker killed held nothing when the primary died: {held}"
    assert orphaned <= {task for task, previous in taken if previous == victim_id}, (orphaned, taken)
