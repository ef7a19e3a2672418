"""Workers survive a database that answers but refuses: read-only for 8 s mid-run, then writable.

What clients see when they land on an old primary, or on a reader during a
managed failover: every session is cut (``57P01``), and the new ones come up
read-only — every write, and every ``SELECT ... FOR UPDATE`` of a claim, fails
with ``25006`` (an ``InternalError``, not a lost connection). The shared cluster
is left alone: only this test's database turns read-only
(``default_transaction_read_only``, which a session takes when it starts), and
only the workers' sessions are cut. The sandbox stands in for a payment system
whose database survives what happens to ours: the test process (and so
``live_server``) starts its sessions with ``default_transaction_read_only=off``.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal

import psycopg
import pytest
from django.db import DatabaseError, InternalError, connection, connections, transaction
from django.utils import timezone

from config import metrics as metrics_config
from demo.sandbox.models import Effect, Fault
from ledger.models import Action
from runtime import reconnect, runner
from runtime.heartbeats import Heartbeats
from runtime.loop import Loop
from tasks import leases, liveness
from tasks.liveness import APPLICATION_NAME as LIVENESS_APPLICATION_NAME
from tasks.models import Lease, Task
from tasks.states import State
from tests.conftest import make_task
from tests.observability.test_metrics import scrape, value
from tests.workflow import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TASKS = 30
WORKERS = 3
# Long enough for every worker to fail its claims, sends and commits repeatedly, its reconnect waits grown
# to their 2 s cap (runtime.reconnect.Backoff: there within about 2 s); a heartbeat thread meeting the
# refusal is pinned in this process below (at the workers' ttl / 3 = 10 s it may or may not beat in here).
READ_ONLY_FOR = 8.0
DONE_WITHIN = 10.0  # seconds after the database takes writes again
# A lease TTL as in production: a lease left behind by the refusal would hold its task this long,
# far past DONE_WITHIN, so only leases given back on recovery let the test pass.
LEASE_TTL = 30.0
ERRORS = "durable_worker_database_errors_total"
WORKER_ENV = {
    "LEASE_TTL_SECONDS": str(LEASE_TTL),
    "LOG_LEVEL": "WARNING",
    # A send in flight when the database refused its record leaves the action in doubt: the reconciler
    # settles it by lookup, trusting "not found" only past CONNECTOR_MAX_IN_FLIGHT. The sandbox commits
    # within the 0.4 s latency, so 3 s is safe here (the 60 s default would outlast DONE_WITHIN).
    "CONNECTOR_MAX_IN_FLIGHT": "3",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
}


@pytest.fixture
def writable_test_sessions():
    """This process's sessions (the test's, ``live_server``'s) stay writable whatever the database says."""
    options = connection.settings_dict.setdefault("OPTIONS", {})
    before = options.get("options")
    options["options"] = "-c default_transaction_read_only=off"
    connection.close()  # the next query starts a session with the option
    yield
    if before is None:
        options.pop("options", None)
    else:
        options["options"] = before
    connection.close()


@contextmanager
def read_only_database():
    """The database turns read-only as a demoted primary does: sessions cut, new ones read-only."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND application_name IN ('durable-worker', %s)",
            [LIVENESS_APPLICATION_NAME],
        )
    try:
        assert a_new_session_is_read_only(), "the database did not turn read-only"
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')


def a_new_session_is_read_only() -> bool:
    """What a worker's next connection gets (without this process's override)."""
    params = {k: v for k, v in connection.get_connection_params().items() if k != "options"}
    with psycopg.connect(**params) as conn:
        row = conn.execute("SHOW transaction_read_only").fetchone()
    return row is not None and row[0] == "on"


def invoices(tenant) -> list[Task]:
    return [
        make_task(
            tenant,
            task_type="pay_invoice",
            objective=f"Pay INV-RO-{n:03d}",
            input={"invoice_id": f"INV-RO-{n:03d}", "amount": str(Decimal(100 + n) / 100)},
        )
        for n in range(TASKS)
    ]


def unfinished(tasks: list[Task]) -> Counter[str]:
    return Counter(
        Task.objects.filter(pk__in=[t.pk for t in tasks])
        .exclude(state=State.COMPLETED)
        .values_list("state", flat=True)
    )


def test_workers_ride_out_a_read_only_database_and_finish_every_task_once(
    acme, writable_test_sessions, workers
):
    tasks = invoices(acme)
    # Slow payments, so the switch lands while sends are in flight and leases are held.
    Fault.objects.create(
        system="payments", operation="dispatch", kind="latency", remaining=10_000, params={"ms": 400}
    )
    fleet = [
        workers(lease_ttl=LEASE_TTL, extra_env=WORKER_ENV, args=("--concurrency", "2"))
        for _ in range(WORKERS)
    ]

    def dead() -> list[str]:
        """What each worker that exited said last (their output is read once they are gone)."""
        return [f"pid {w.process.pid}:\n{w.process.stdout.read()[-4000:]}" for w in fleet if w.process.poll()
                is not None]  # fmt: skip

    wait_for(lambda: Effect.objects.filter(system="payments").count() >= 3 or dead(), timeout=45,
             what="the workers to be mid-run")  # fmt: skip
    assert not dead(), f"a worker exited before the switch: {dead()}"
    assert unfinished(tasks), "every task finished before the switch: the run no longer lands mid-run"

    with read_only_database():
        refused_at = time.monotonic()
        while time.monotonic() - refused_at < READ_ONLY_FOR:
            assert not dead(), f"a worker exited while the database was read-only: {dead()}"
            time.sleep(0.5)
        pending = unfinished(tasks)
    back = time.monotonic()

    while unfinished(tasks) and not dead() and time.monotonic() - back < DONE_WITHIN:
        time.sleep(0.1)
    took = time.monotonic() - back
    print(f"\nread-only {READ_ONLY_FOR:.0f}s: {dict(pending)} left at the return, done {took:.1f}s after")
    assert not dead(), f"a worker exited after the database came back: {dead()}"
    assert not unfinished(tasks), (
        f"{dict(unfinished(tasks))} still unfinished {took:.1f}s after the database took writes again"
        f" ({dict(pending)} when it did)"
    )
    assert pending, "nothing was left to do when the database came back: the switch proved nothing"

    # Nothing sent twice: one payment per invoice, one ledger action per task, and it is that payment.
    paid = Counter(e.request.get("invoice") for e in Effect.objects.filter(system="payments"))
    assert sorted(paid) == sorted(t.input["invoice_id"] for t in tasks)
    assert [invoice for invoice, n in paid.items() if n > 1] == []
    actions = Action.objects.filter(connector="payments")
    assert Counter(actions.values_list("task_id", flat=True)) == Counter({t.pk: 1 for t in tasks})


# --- the same, one piece at a time, in this process --------------------------------------------------


def error_of(sql: str, *, read_only: bool = False) -> DatabaseError:
    """What the real PostgreSQL answers ``sql`` with."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if read_only:
                cursor.execute("SET TRANSACTION READ ONLY")
            cursor.execute(sql)
    except DatabaseError as error:
        return error
    raise AssertionError(f"{sql!r} went through")


def test_a_write_refused_as_read_only_is_handled_like_a_lost_connection(db):
    refused = error_of(f"UPDATE {Task._meta.db_table} SET updated_at = updated_at", read_only=True)
    assert isinstance(refused, InternalError) and not isinstance(refused, reconnect.CONNECTION_LOST)
    assert (reconnect.sqlstate(refused), reconnect.classify(refused)) == ("25006", "read_only")
    assert (
        reconnect.classify(error_of("SELECT 1/0")) == reconnect.UNCLASSIFIED
    )  # 22012: not the server's state


def test_the_claim_loop_survives_database_errors_it_cannot_classify_and_counts_them(db, client, settings):
    settings.METRICS_CACHE_SECONDS, settings.METRICS_TOKEN = 0, ""
    settings.METRICS_ALLOW_IPS = ["127.0.0.1/32"]
    assert metrics_config.configure()
    before = scrape(client)
    rounds: list[int] = []

    def chores() -> int:
        rounds.append(1)
        if len(rounds) <= 2:
            with connection.cursor() as cursor:  # 42P01, raised as Django's ProgrammingError
                cursor.execute("SELECT * FROM no_such_table_i21ro")
        return 0

    loop = Loop("w-i21ro", "nowhere-i21ro", 1, timedelta(seconds=30), idle=0.01, chores=chores, chore_every=0)
    try:
        assert loop.run(should_stop=lambda: len(rounds) >= 3)  # returned, not raised, after two failures
    finally:
        liveness.stop()
        connections.close_all()
    assert len(rounds) == 3
    labels = {"reason": "unclassified", "where": "claim"}
    counted = value(scrape(client), ERRORS, **labels) - value(before, ERRORS, **labels)
    assert counted == 2


def test_a_slot_that_meets_an_unclassified_error_gives_its_lease_back_at_once(acme, monkeypatch):
    task = make_task(acme)
    runs: list[leases.Held] = []

    def run_task(task_id, *, held, **kwargs) -> str:
        runs.append(held)
        if len(runs) == 1:
            with connection.cursor() as cursor:
                cursor.execute("SELECT * FROM no_such_table_i21ro")
        return "completed"

    monkeypatch.setattr(runner, "run_task", run_task)
    deadline = time.monotonic() + 10  # far below the lease's 30 s: only a lease given back is claimed again
    loop = Loop("w-i21ro", "default", 1, timedelta(seconds=30), idle=0.05)
    try:
        loop.run(should_stop=lambda: len(runs) >= 2 or time.monotonic() > deadline)
    finally:
        liveness.stop()
        connections.close_all()
    assert [held.task_id for held in runs] == [task.pk, task.pk], "the task was not claimed again"


def test_the_heartbeat_thread_beats_again_on_a_fresh_session_once_the_database_takes_writes(acme):
    held = leases.claim(make_task(acme).pk, worker_id="w-i21ro", region="default", ttl=timedelta(seconds=30))
    assert held is not None
    beats = Heartbeats(timedelta(seconds=30), every=0.1)
    beats.hold(held)
    try:
        with read_only_database():  # the thread's session starts read-only, and would stay so
            beats.start()
            time.sleep(1.0)
            assert beats._thread is not None and beats._thread.is_alive()
        writable_at = timezone.now()
        wait_for(
            lambda: Lease.objects.get(task_id=held.task_id).heartbeat_at > writable_at,
            timeout=5,
            what="a beat once the database takes writes",
        )
    finally:
        beats.stop()
        liveness.stop()


def test_the_celery_entry_point_waits_out_a_write_refused_as_read_only_and_runs_the_task(acme, monkeypatch):
    from runtime import workers

    task = make_task(acme)
    runs: list[str] = []

    def run_task(task_id, **kwargs) -> str:
        runs.append(task_id)
        if len(runs) == 1:  # the server answers, but refuses the write (25006, an InternalError)
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
                cursor.execute(f"UPDATE {Task._meta.db_table} SET updated_at = updated_at")
        return "completed"

    monkeypatch.setattr(runner, "run_task", run_task)
    try:
        assert workers.run_task.run(str(task.pk)) == "completed"  # not raised: retried once writes work
    finally:
        liveness.stop()
        connections.close_all()
    assert runs == [str(task.pk), str(task.pk)]
