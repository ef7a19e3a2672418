"""A worker host cut off from the database mid-step: nothing it commits late lands, nothing is paid twice.

``make partition-test`` (marker ``cluster``: ``make cluster-test`` runs it too). Two
``run_worker`` processes, each on a host of its own (``tests.cluster.netns``: a
network namespace on a veth link), reach a private PostgreSQL and the sandbox
(the payment system, on this test's database on the shared cluster) over their
links. Every payment takes 1 s at the sandbox, so a worker always has sends in
flight.

``test_a_worker_host_cut_off_commits_nothing_after_the_takeover_and_rejoins``:

1. Worker A holds leases, one of them on a task whose payment is being sent;
   its link is cut (every packet dropped both ways: no RST, no ICMP; its
   process lives on) for ``PARTITION_SECONDS`` (30).
2. Worker B takes A's tasks over once their leases lapse (``--lease-ttl``: A
   cannot heartbeat). A's liveness lock does not decide that: its session stays
   on the server, holding the lock, until the server's keepalives give up on
   A's address — which they must do within the partition
   (``config.dsn.detect_dead_peers``: about 11 s, not the two hours of the
   kernel's defaults). The payments A had in flight are found at the sandbox by
   their keys (lookup before any resend), not sent again.
3. The link comes back and B stops (SIGTERM, cleanly). A's pre-cut work ends
   without landing: its connections were given up within seconds
   (``tcp_user_timeout``, keepalives), and anything that did reach the server
   late is refused by the lease token (``discarded a stale decision``). A
   reconnects and completes every task left; it stops cleanly at the end.

``test_a_worker_cut_off_from_the_payment_system_alone_settles_by_lookup``: only
the sandbox's port is dropped while payments are in flight: their outcome is
unknown (the answer never came), the reconciler asks the payment system once
the link is back and settles each by its key; nothing is paid twice.

What must hold in both: each invoice paid exactly once at the sandbox; every task
completed on its one payment; no worker exited on its own. The figures (seconds
from the cut to the takeover, to the liveness lock's end) are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal
from urllib.parse import urlsplit

import pytest

from demo.sandbox.models import Effect, Fault
from tasks.states import State
from tests.chaos.test_standby_failover import copy_schema
from tests.cluster import netns
from tests.conftest import make_task
from tests.workflow import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]

DATABASE = "durable"  # copy_schema's database on the private server
PARTITION_SECONDS = float(os.environ.get("PARTITION_SECONDS", "30"))
LEASE_TTL = 4.0
WORKER_ENV = {
    "LOG_LEVEL": "INFO",
    # A send whose answer never came is in doubt: the reconciler asks the system, and trusts "not found"
    # only past CONNECTOR_MAX_IN_FLIGHT (the sandbox commits within its 1 s latency).
    "CONNECTOR_TIMEOUT": "2",
    "CONNECTOR_MAX_IN_FLIGHT": "4",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
    "RECONCILE_INTERVAL": "1",
}
LIVE_LEASES = (
    "SELECT task_id::text FROM tasks_lease WHERE worker_id = %s AND expires_at > now() "
    "AND heartbeat_at < expires_at"
)
SENDING = (
    "SELECT a.task_id::text FROM ledger_action a JOIN tasks_lease l ON l.task_id = a.task_id "
    "WHERE a.dispatch_state = 'dispatching' AND l.worker_id = %s AND l.expires_at > now()"
)
LIVENESS_FROM = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'durable-worker-liveness' "
    "AND client_addr = %s::inet"
)


@dataclass
class Worker:
    """``run_worker`` on ``host``; its output kept as it comes (a full pipe would stall it)."""

    host: netns.Host
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls, host: netns.Host, server: netns.PrivateServer, sandbox: str, *, concurrency: int
    ) -> Worker:
        process = netns.start_worker(
            host, database_url=server.url_from(host, DATABASE), sandbox_url=sandbox.format(host=host.host_ip),
            lease_ttl=LEASE_TTL, concurrency=concurrency, env=WORKER_ENV,
        )  # fmt: skip
        worker = cls(host, process)
        threading.Thread(target=worker._drain, daemon=True).start()
        return worker

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    @property
    def id(self) -> str:
        return f"{socket.gethostname()}:{self.process.pid}"  # runtime.workers.worker_id

    def said(self, text: str) -> int:
        return sum(text in line for line in self.lines)

    def alive(self) -> None:
        assert self.process.poll() is None, f"worker exited {self.process.returncode}:\n{self.tail()}"

    def tail(self) -> str:
        return "".join(self.lines)[-4000:]

    def stop(self) -> int | None:
        """SIGTERM, and its exit status (None: it had to be killed)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return None
        return self.process.returncode


def invoices(acme, count: int, prefix: str) -> set[str]:
    """``count`` ``pay_invoice`` tasks in this test's database (copied to the private server after)."""
    names = {f"INV-{prefix}-{n:03d}" for n in range(count)}
    for name in sorted(names):
        make_task(acme, task_type="pay_invoice", objective=f"Pay {name}",
                  input={"invoice_id": name, "amount": str(Decimal("1.50")), "currency": "EUR"})  # fmt: skip
    return names


def slow_payments() -> None:
    Fault.objects.create(
        system="payments", operation="dispatch", kind="latency", remaining=100_000, params={"ms": 1000}
    )


def paid() -> Counter[str]:
    return Counter(e.request.get("invoice") for e in Effect.objects.filter(system="payments"))


def tasks_on(server: netns.PrivateServer) -> dict[str, tuple[str, dict]]:
    rows = server.query("SELECT input->>'invoice_id', state, outcome FROM tasks_task", dbname=DATABASE)
    return {name: (state, outcome if isinstance(outcome, dict) else json.loads(outcome or "{}"))
            for name, state, outcome in rows}  # fmt: skip


def all_completed(server: netns.PrivateServer) -> bool:
    return all(state == State.COMPLETED for state, _ in tasks_on(server).values())


def check_paid_once(server: netns.PrivateServer, names: set[str]) -> None:
    payments = paid()
    assert {name: n for name, n in payments.items() if n != 1} == {}, "an invoice paid twice"
    assert set(payments) == names, "an invoice never paid"
    refs = {e.request["invoice"]: str(e.pk) for e in Effect.objects.filter(system="payments")}
    after = tasks_on(server)
    assert set(after) == names
    for name, (state, outcome) in after.items():
        assert state == State.COMPLETED, (name, state)
        assert outcome["payment_ref"] == refs[name], name


def test_a_worker_host_cut_off_commits_nothing_after_the_takeover_and_rejoins(
    acme, network, private_server, sandbox_relay
):
    server = private_server
    names = invoices(acme, 60, "PT")
    copy_schema(server)
    slow_payments()
    cut_host, other_host = network.hosts
    a = Worker.start(cut_host, server, sandbox_relay, concurrency=3)
    b = Worker.start(other_host, server, sandbox_relay, concurrency=1)
    try:
        # 1. A holds leases, one of them on a task whose payment is on its way.
        wait_for(lambda: a.alive() or server.query(SENDING, (a.id,), dbname=DATABASE), timeout=120,
                 what="worker A to be sending a payment")  # fmt: skip
        held = {row[0] for row in server.query(LIVE_LEASES, (a.id,), dbname=DATABASE)}
        assert held
        cut_host.cut()
        cut_at = time.monotonic()

        # 2. B takes A's tasks over once their leases lapse; A's liveness session stays a while.
        lock_gone_after: float | None = None
        taken_after: float | None = None
        while time.monotonic() - cut_at < PARTITION_SECONDS:
            a.alive()
            b.alive()
            now = time.monotonic() - cut_at
            if lock_gone_after is None and not server.query(LIVENESS_FROM, (cut_host.ip,))[0][0]:
                lock_gone_after = now
            taken = server.query(
                "SELECT task_id::text FROM audit_leasetakeover WHERE previous_worker_id = %s",
                (a.id,),
                dbname=DATABASE,
            )
            if taken_after is None and held <= {row[0] for row in taken}:
                taken_after = now
            time.sleep(0.2)
        assert taken_after is not None, f"B took over none of A's tasks within {PARTITION_SECONDS}s: {held}"
        assert taken_after >= LEASE_TTL - 1, "a lease was taken before its TTL could have run out"

        assert lock_gone_after is not None, "A's liveness session outlived the partition on the server"

        # 3. The link comes back, and B stops (cleanly): what is left is A's to finish. A's late commits
        # are refused, it finds its leases lost, reconnects and completes every task left.
        cut_host.heal()
        healed_at, healed_wall = time.monotonic(), time.time()
        b_status = b.stop()
        left = sum(state != State.COMPLETED for state, _ in tasks_on(server).values())
        assert left, "nothing left for A after the partition: more tasks, or slower payments"
        wait_for(lambda: a.alive() or all_completed(server), timeout=240, what="every task completed by A")
        finished_after = time.monotonic() - healed_at
        # Its pre-cut work ended without landing: its connections given up (tcp_user_timeout, keepalives)
        # or, had one survived the partition, its commits refused by the lease token.
        wait_for(lambda: a.said("connection_lost") or a.said("discarded a stale decision"), timeout=60,
                 what="worker A to give up its connections or have its commits refused")  # fmt: skip
        first_commit = server.query(
            "SELECT min(extract(epoch FROM created_at))::float8 FROM audit_transitionevent "
            "WHERE actor_id = %s AND created_at > to_timestamp(%s)", (f"worker:{a.id}", healed_wall),
            dbname=DATABASE,
        )[0][0]  # fmt: skip
        assert first_commit is not None, "A committed nothing after the link came back"
        rejoined_after = first_commit - healed_wall
        events = server.query(
            "SELECT task_id::text, state_version, actor_id FROM audit_transitionevent", dbname=DATABASE
        )
    finally:
        a_status, b_status = a.stop(), b.stop()
    figures = {
        "held_at_cut": len(held),
        "takeover_s": round(taken_after, 1),
        "liveness_lock_gone_s": None if lock_gone_after is None else round(lock_gone_after, 1),
        "left_for_a_at_heal": left,
        "a_first_commit_after_heal_s": round(rejoined_after, 1),
        "all_done_after_heal_s": round(finished_after, 1),
        "a_leases_lost_lines": a.said("leases lost"),
        "a_connection_lost_lines": a.said("connection_lost"),
        "a_stale_decisions": a.said("discarded a stale decision"),
    }
    print(f"\npartition: {json.dumps(figures)}")
    assert (a_status, b_status) == (0, 0), f"A:\n{a.tail()}\nB:\n{b.tail()}"
    check_paid_once(server, names)
    # B committed on every task it took over (A's late work, if any reached the server, was refused).
    for task in held:
        actors = [actor for t, _, actor in sorted(events) if t == task]
        assert f"worker:{b.id}" in actors, (task, actors)


def test_a_worker_cut_off_from_the_payment_system_alone_settles_by_lookup(
    acme, network, private_server, sandbox_relay
):
    server = private_server
    names = invoices(acme, 6, "PS")
    copy_schema(server)
    slow_payments()
    host = network.hosts[0]
    worker = Worker.start(host, server, sandbox_relay, concurrency=3)
    try:
        wait_for(lambda: worker.alive() or server.query(SENDING, (worker.id,), dbname=DATABASE),
                 timeout=120, what="a payment on its way")  # fmt: skip
        time.sleep(0.3)  # the request reached the sandbox, which answers after its 1 s
        host.cut_port(urlsplit(sandbox_relay.format(host=host.host_ip)).port or 80)
        doubtful = wait_for(lambda: worker.alive() or server.query(
            "SELECT id::text FROM ledger_action WHERE dispatch_state = 'unknown'", dbname=DATABASE),
            timeout=60, what="a payment whose outcome is unknown")  # fmt: skip
        time.sleep(5)  # lookups fail meanwhile: the payment system cannot be asked
        host.heal()
        wait_for(lambda: worker.alive() or all_completed(server), timeout=180, what="every task completed")
        settled = server.query(
            "SELECT id::text, dispatch_state, attempts, duplicates_suppressed FROM ledger_action",
            dbname=DATABASE,
        )
    finally:
        status = worker.stop()
    print(f"\nsandbox partition: {json.dumps(settled)}")
    assert status == 0, worker.tail()
    check_paid_once(server, names)
    # Each payment in doubt was settled on its one payment: found by its key (lookup), or sent again
    # under the same key and answered with the first payment (the sandbox deduplicates by key).
    outcome = {row[0]: row[1] for row in settled}
    assert {outcome[row[0]] for row in doubtful} <= {"succeeded", "reconciled_succeeded"}, settled
