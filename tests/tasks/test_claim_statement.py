"""The one-statement claim on PostgreSQL (``tasks.leases._claim_statement``) against the ORM claim.

Every guarantee test runs both ways: ``statement`` (what PostgreSQL runs) and ``orm`` (the
transaction of a few statements SQLite runs, forced here on PostgreSQL). Round trips are counted on
the wire (libpq's protocol trace of the connection: every message that ends a request the client
waits on), so the ``BEGIN`` and ``COMMIT`` of a transaction count as what they cost. Races run in
real threads, each on a connection of its own, against committed rows (``transaction=True``).
"""

from __future__ import annotations

import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from psycopg import pq

from audit.chain import GENESIS, takeover_hash
from audit.keys import chain_keys
from audit.models import LeaseTakeover, TransitionEvent
from tasks import cancellation, checkpoints, hotpath, leases, liveness, services
from tasks.models import CancelScope, Checkpoint, Lease, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress
from tests.workflow import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

REGION = "default"
LONG = timedelta(minutes=10)  # nothing here waits for a TTL but the lapses below


@pytest.fixture(params=["statement", "orm"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "orm":
        monkeypatch.setattr(leases, "in_one_statement", lambda: False)
    return str(request.param)


@contextmanager
def round_trips() -> Iterator[list[int]]:
    """Count the requests this thread's connection waits on while the block runs (libpq trace)."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    counted: list[int] = []
    with tempfile.TemporaryFile() as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            yield counted
        finally:
            pgconn.untrace()
        trace.seek(0)
        lines = trace.read().decode().splitlines()
    # From the client ("F"): a simple query ("Query") or the end of an extended one ("Sync").
    counted.append(
        sum(1 for line in lines if line.split()[:1] == ["F"] and line.split()[2] in {"Query", "Sync"})
    )


class Holder:
    """Another worker process's liveness session: it holds ``key`` until closed (as in test_liveness)."""

    def __init__(self, key: int):
        self.key = key
        self.conn = psycopg.connect(**liveness._connect_params())
        self.conn.execute("SELECT pg_advisory_lock(%s)", (key,))

    def close(self) -> None:
        self.conn.close()

        def dropped() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT count(*) FROM ({liveness.HELD_KEYS_SQL}) k(key) WHERE key = %s", [self.key]
                )
                return not cursor.fetchone()[0]

        wait_for(dropped, timeout=5, what="the server to drop the session's lock")


def held_by(task: Task, worker: str, key: int | None, ttl: timedelta = LONG) -> leases.Held:
    lease = leases.claim(task.id, worker_id=worker, region=REGION, ttl=ttl)
    assert lease is not None
    Lease.objects.filter(task=task).update(holder_key=key)  # as that worker's process stamped it
    return lease


def claim_next(worker: str, limit: int = 10, **kwargs: Any) -> list[leases.Held]:
    return leases.claim_next(worker_id=worker, region=kwargs.pop("region", REGION), limit=limit, **kwargs)


# --- Round trips ------------------------------------------------------------------------------


def test_a_claim_is_one_round_trip_on_postgresql_where_the_orm_claim_takes_several(acme, monkeypatch):
    fresh = [make_task(acme) for _ in range(3)]
    with round_trips() as statement:
        assert len(claim_next("w1", limit=3)) == 3  # their lease rows inserted
    for lease in Lease.objects.filter(task__in=fresh):
        leases.release(leases.Held(lease.task_id, lease.worker_id, lease.token))
    with round_trips() as handed_on:
        assert [h.token for h in claim_next("w2", limit=3)] == [2, 2, 2]  # moved on one token
    with round_trips() as idle:
        assert claim_next("w3") == []

    monkeypatch.setattr(leases, "in_one_statement", lambda: False)
    more = [make_task(acme) for _ in range(3)]
    with round_trips() as orm_fresh:
        assert len(claim_next("w4", limit=3)) == 3
    for lease in Lease.objects.filter(task__in=more):
        leases.release(leases.Held(lease.task_id, lease.worker_id, lease.token))
    with round_trips() as orm_handed_on:
        assert len(claim_next("w5", limit=3)) == 3

    assert (statement, handed_on, idle) == ([1], [1], [1])
    # BEGIN, the candidates, their lease rows, the insert or the update, COMMIT.
    assert orm_fresh[0] >= 5 and orm_handed_on[0] >= 5, (orm_fresh, orm_handed_on)


def test_the_claim_returns_the_task_row_and_whether_a_cancel_request_is_open(acme):
    quiet, asked = make_task(acme), make_task(acme)
    cancellation.request_scoped(
        asked, CancelScope.MODEL_TURN, actor=Actor.system("tests"), reason="stop the turn"
    )

    held = {h.task_id: h for h in claim_next("w1")}

    assert held[quiet.id].cancel_open is False and held[asked.id].cancel_open is True
    for task in (quiet, asked):
        row, fresh = held[task.id].task, Task.objects.get(pk=task.id)
        assert row is not None
        assert (row.state, row.state_version, row.ownership_epoch, row.input, row.objective) == (
            fresh.state, fresh.state_version, fresh.ownership_epoch, fresh.input, fresh.objective,
        )  # fmt: skip
        assert row.tenant_id == fresh.tenant_id and row.deadline == fresh.deadline


def test_the_claim_returns_the_newest_checkpoint_the_event_vouching_for_it_and_the_tenant(acme):
    """What the first step reads next comes with the claim: resuming from it sends no statement."""
    task = make_task(acme)
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w0"), progress=progress("pay", amount="3"))

    (held,) = claim_next("w1")

    assert held.stored is not None and held.task is not None
    newest = Checkpoint.objects.get(task=task, state_version=2)
    assert held.stored.version == held.task.state_version == 2
    assert held.stored.checkpoint is not None and held.stored.event is not None
    assert (held.stored.checkpoint.pk, held.stored.checkpoint.body) == (newest.pk, newest.body)
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert (held.stored.event.pk, held.stored.event.hash, held.stored.event.created_at) == (
        event.pk, event.hash, event.created_at,
    )  # fmt: skip
    assert held.stored.recorded_digest == newest.digest != ""
    with CaptureQueriesContext(connection) as captured:
        point = services.task_resume_point(
            task.id, actor=Actor.worker("w1"), lease=held, task=held.task, stored=held.stored
        )
        slug = point.task.tenant.slug
    assert captured.captured_queries == []
    assert slug == acme.slug
    assert point.checkpoint is not None and (point.checkpoint.step, point.checkpoint.facts) == (
        "pay", {"amount": "3"},
    )  # fmt: skip
    assert point.checkpoint == services.latest_checkpoint(task, vouched=True)


def test_a_claimed_checkpoint_is_verified_as_one_read_afterwards_would_be(acme):
    """The claim's read of a checkpoint changed behind the application's back is refused, as a read of
    its own would refuse it: the task is quarantined, nothing resumes from it."""
    task = make_task(acme)
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w0"), progress=progress("pay", amount="3"))
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE tasks_checkpoint DISABLE TRIGGER tasks_checkpoint_append_only")
        cursor.execute(
            "UPDATE tasks_checkpoint SET body = replace(body, '\"3\"', '\"9\"')"
            " WHERE task_id = %s AND state_version = 2",
            [task.id],
        )
        assert cursor.rowcount == 1
        cursor.execute("ALTER TABLE tasks_checkpoint ENABLE TRIGGER tasks_checkpoint_append_only")

    (held,) = claim_next("w1")
    assert held.stored is not None and held.stored.checkpoint is not None
    point = services.task_resume_point(
        task.id, actor=Actor.worker("w1"), lease=held, task=held.task, stored=held.stored
    )

    assert point.quarantined
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_reason) == (
        State.QUARANTINED,
        checkpoints.CheckpointUnreadable.DIGEST_MISMATCH,
    )


def test_a_claimed_checkpoint_is_used_only_at_the_version_it_was_read_at(acme, monkeypatch):
    """The row the claim locks can be newer than its snapshot (a commit between the statement's start
    and the lock): then the checkpoint it read may not be that version's newest, and is not kept. The
    race itself is not timed here: the statement is made to see the task one version behind."""
    task = make_task(acme)
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w0"), progress=progress("pay"))
    built = leases._claim_statement_for

    def behind(gone_check: bool, *, by_id: bool) -> Any:
        sql, *rest = built(gone_check, by_id=by_id)
        snapshot = '(SELECT s."state_version" FROM'
        assert sql.count(snapshot) == 1
        return (sql.replace(snapshot, '(SELECT s."state_version" - 1 FROM'), *rest)

    monkeypatch.setattr(leases, "_claim_statement_for", behind)
    (held,) = claim_next("w1")
    assert held.task is not None and held.stored is None

    # And a read kept from an older version is not used for the task as it is now: it is read again.
    monkeypatch.undo()
    leases.release(held)
    (again,) = claim_next("w2")
    assert again.stored is not None and again.stored.current_for(task)
    moved = advance(task.id, 2, State.READY, actor=Actor.worker("w2"), progress=progress("ship"), lease=again)
    assert not again.stored.current_for(moved)
    with CaptureQueriesContext(connection) as captured:
        point = services.latest_checkpoint(moved, vouched=True, stored=again.stored)
    assert point.step == "ship" and len(captured.captured_queries) == 1


def test_the_newest_checkpoint_read_on_its_own_is_one_statement_as_in_the_claim(acme):
    task = make_task(acme)
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w0"), progress=progress("pay"))
    (held,) = claim_next("w1")
    alone = hotpath.newest_checkpoint(task.id)
    assert held.stored is not None and alone.version is None
    assert alone.checkpoint is not None and alone.event is not None
    assert (alone.checkpoint.pk, alone.event.pk) == (held.stored.checkpoint.pk, held.stored.event.pk)
    assert hotpath.newest_checkpoint(make_task(acme).id).checkpoint is not None  # the creation's
    assert hotpath.newest_checkpoint(task.id.hex[::-1]) == hotpath.Stored(None, None)


# --- The guarantees, both ways ------------------------------------------------------------------


def test_concurrent_claimers_never_claim_a_task_twice(acme, way):
    tasks = [make_task(acme) for _ in range(12)]
    claimers, rounds = 6, 8
    taken: list[list[tuple[Any, int]]] = [[] for _ in range(claimers)]
    barrier = threading.Barrier(claimers)

    def work(n: int) -> None:
        try:
            barrier.wait()
            for _ in range(rounds):
                held = claim_next(f"w{n}", limit=3)
                taken[n] += [(h.task_id, h.token) for h in held]
                for lease in held:
                    leases.release(lease)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    claims = [claim for per_claimer in taken for claim in per_claimer]
    assert claims, "nobody claimed anything"
    assert len(set(claims)) == len(claims)  # no (task, token) twice: no double claim
    per_task = Counter(task_id for task_id, _ in claims)
    tokens = dict(Lease.objects.filter(task__in=tasks).values_list("task_id", "token"))
    assert per_task == Counter({task_id: token for task_id, token in tokens.items()})  # every claim moved one
    assert not LeaseTakeover.objects.exists()  # each was released, none taken over


def test_a_lease_that_lapsed_in_another_workers_hands_is_taken_with_a_chained_takeover(acme, way):
    task, other = make_task(acme), make_task(acme)
    stale = held_by(task, "w1", None, ttl=timedelta(milliseconds=200))
    before = Lease.objects.get(task=task)
    wait_for(lambda: Lease.objects.filter(task=task, expires_at__lt=timezone.now()).exists(), timeout=5)

    held = {h.task_id: h for h in claim_next("w2")}

    assert held[task.id].token == stale.token + 1 and held[other.id].token == 1
    [record] = LeaseTakeover.objects.filter(task=task)
    assert (record.worker_id, record.token, record.previous_worker_id, record.stale_token) == (
        "w2", stale.token + 1, "w1", stale.token,
    )  # fmt: skip
    assert (record.previous_heartbeat_at, record.previous_expires_at) == (
        before.heartbeat_at,
        before.expires_at,
    )
    key = chain_keys()[record.key_id]
    assert record.prev_hash == GENESIS and record.hash == takeover_hash(GENESIS, record, key)
    assert Task.objects.get(pk=task.id).takeover_head == record.hash

    # A second lapse chains on the first.
    # Lapsed a moment after its last heartbeat (not given up: that would leave the two equal).
    Lease.objects.filter(task=task).update(expires_at=F("heartbeat_at") + timedelta(milliseconds=1))
    [again] = [h for h in claim_next("w3") if h.task_id == task.id]
    assert again.token == stale.token + 2
    second = LeaseTakeover.objects.get(task=task, token=again.token)
    assert second.prev_hash == record.hash and Task.objects.get(pk=task.id).takeover_head == second.hash


def test_a_lease_whose_holder_is_gone_is_taken_before_its_ttl(acme, way):
    task = make_task(acme)
    holder = Holder(7_100_000_001)
    stale = held_by(task, "dead", holder.key)
    holder.close()  # the process died: its session, and its lock, are gone

    [taken] = claim_next("w2", ttl=LONG)

    assert (taken.task_id, taken.token) == (task.id, stale.token + 1)
    assert Lease.objects.get(task=task).expires_at > timezone.now() + timedelta(minutes=9)
    [record] = LeaseTakeover.objects.filter(task=task)
    assert (record.previous_worker_id, record.stale_token) == ("dead", stale.token)


def test_a_live_lease_of_a_live_holder_is_never_taken(acme, way):
    task, own_dead_key = make_task(acme), make_task(acme)
    holder = Holder(7_100_000_002)
    try:
        held_by(task, "alive", holder.key)
        # Another worker id on a live lease, even one stamped by this very claimer's process.
        held_by(own_dead_key, "alive-too", None)
        assert claim_next("w2") == []
        assert leases.claim(task.id, worker_id="w2", region=REGION) is None
        assert Lease.objects.get(task=task).token == 1 and not LeaseTakeover.objects.exists()
    finally:
        holder.close()


def test_a_released_lease_is_handed_on_and_an_own_lapsed_one_retaken_without_a_takeover(acme, way):
    released, own = make_task(acme), make_task(acme)
    leases.release(held_by(released, "w1", None))
    held_by(own, "w2", None, ttl=timedelta(milliseconds=200))
    wait_for(lambda: Lease.objects.filter(task=own, expires_at__lt=timezone.now()).exists(), timeout=5)

    held = {h.task_id: h.token for h in claim_next("w2")}

    assert held == {released.id: 2, own.id: 2}
    assert not LeaseTakeover.objects.exists()


def test_claims_keep_to_their_region_and_to_runnable_tasks(acme, way):
    here, there = make_task(acme), make_task(acme, region="eu")
    assert [h.task_id for h in claim_next("w1")] == [here.id]
    assert [(h.task_id, h.region) for h in claim_next("w2", region="eu")] == [(there.id, "eu")]
    assert claim_next("w3") == [] and claim_next("w3", region="eu") == []


def test_a_worker_whose_clock_is_off_claims_nothing(acme, way, settings, monkeypatch):
    make_task(acme)
    monkeypatch.setattr(liveness, "claims_refused", lambda: "clock off")
    assert claim_next("w1") == []
    assert not Lease.objects.exists()


def test_the_claim_span_names_the_worker_region_and_count(acme, way, monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(leases, "tracer", provider.get_tracer("tasks.leases"))
    make_task(acme), make_task(acme)
    claim_next("w1")
    [span] = [s for s in exporter.get_finished_spans() if s.name == "lease.claim"]
    assert (span.attributes["durable.worker.id"], span.attributes["durable.region"]) == ("w1", REGION)
    assert span.attributes["durable.lease.count"] == 2


@pytest.mark.parametrize("owner", ["w2", "w1"])  # its own lease (no takeover record), another's (one)
def test_a_lease_extended_while_the_claim_waits_for_its_row_is_not_taken(acme, way, owner):
    """The trap: the candidates are chosen on the statement's snapshot, where this lease has lapsed;
    its holder extends it meanwhile (committed after that snapshot). The lease rows' own condition,
    checked again at their newest version once locked, must leave it to its holder."""
    task = make_task(acme)
    held_by(task, owner, None)
    Lease.objects.filter(task=task).update(expires_at=F("heartbeat_at") + timedelta(milliseconds=1))
    holder = psycopg.connect(**liveness._connect_params() | {"autocommit": False})
    try:
        # The holder's heartbeat, not committed yet: its row lock makes the claim wait.
        holder.execute(
            "UPDATE tasks_lease SET expires_at = now() + interval '10 minutes', heartbeat_at = now()"
            " WHERE task_id = %s",
            (task.id,),
        )
        result: list[Any] = []

        def claimer() -> None:
            try:
                result.append(claim_next("w2"))
            except Exception as error:
                result.append(error)
            finally:
                connections.close_all()

        thread = threading.Thread(target=claimer)
        thread.start()

        def waiting() -> bool:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> %s",
                    [holder.info.backend_pid],
                )
                return bool(cursor.fetchone()[0])

        wait_for(waiting, timeout=20, what="the claim to wait for the lease row")
        holder.commit()
        thread.join(timeout=30)
    finally:
        holder.close()

    assert result == [[]]
    lease = Lease.objects.get(task=task)
    assert (lease.worker_id, lease.token) == (owner, 1) and not LeaseTakeover.objects.exists()


def test_a_slot_reads_cancel_requests_before_its_first_step_only_when_the_claim_saw_one(acme):
    from runtime.heartbeats import Heartbeats

    quiet, asked = make_task(acme), make_task(acme)
    cancellation.request_scoped(asked, CancelScope.MODEL_TURN, actor=Actor.system("tests"), reason="stop it")
    held = {h.task_id: h for h in claim_next("w1", limit=2)}
    beats = Heartbeats(timedelta(seconds=30))

    assert not beats.hold(held[quiet.id]).asked.is_set()  # the claim read none: nothing to read again
    assert beats.hold(held[asked.id]).asked.is_set()
    unknown = leases.Held(quiet.id, "w1", held[quiet.id].token)  # an ORM claim, a takeover: not read
    assert beats.hold(unknown).asked.is_set()
