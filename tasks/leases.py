"""Leases: short, fenced claims on runnable tasks.

A worker claims a task before running its steps, heartbeats while it works
and releases the lease when it stops. A worker that dies simply stops
heartbeating: its lease lapses and the task — whose state only ever changed
through committed transitions — becomes claimable again. On PostgreSQL a dead
worker's leases do not wait for their TTL: each lease names its holder's
liveness lock (``tasks.liveness``), and a lease whose holder's lock is gone
counts as lapsed.

On PostgreSQL the claim locks candidate task rows with ``FOR UPDATE SKIP
LOCKED``, so concurrent claimers never wait on each other and never claim the
same task. SQLite (demo only) ignores that clause; there the lease row's
compare-and-set is what keeps a claim single.

Every time a lease is judged by comes from the database's clock: the claim reads its ``now``
in its first statement, and the heartbeat, release and fence statements use
``now`` inside themselves (``Now()``), so a worker whose own clock is off
neither takes live leases nor writes leases that outlive it. A worker too far
off the database's clock claims nothing (``liveness.claims_refused``): the
times it writes elsewhere (deadlines, audit times) would be wrong.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.db.models.expressions import RawSQL
from django.db.models.functions import Now
from opentelemetry import trace

from audit.chain import GENESIS, takeover_hash
from audit.keys import current_chain_key
from audit.models import LeaseTakeover
from tasks import checkpoints, hotpath, liveness, metrics
from tasks.models import CancelRequest, Lease, Task
from tasks.states import RUNNABLE
from tenancy.models import Tenant

DEFAULT_TTL = timedelta(seconds=30)
tracer = trace.get_tracer(__name__)


@dataclass(frozen=True)
class Held:
    """A lease this process holds: what it passes to ``advance(lease=…)``."""

    task_id: UUID
    worker_id: str
    token: int
    # The task's ownership epoch when the lease was claimed (read under the claim's row lock): every
    # commit made under the lease requires it still (``tasks.hotpath.compare_and_set``), so a worker of a
    # region the task failed over from cannot commit (``StaleEpoch``).
    epoch: int = 1
    region: str = field(default="", compare=False)  # the region it was claimed in, for refusals to name
    # Read by the one-statement claim (PostgreSQL) under the claim's row lock, so the runner need not
    # read them again: the task row as claimed (its tenant with it), whether a cancel request of it was
    # open then, and its newest checkpoint with the event vouching for it (``stored``: None when the
    # claim's snapshot had the task at another version than the row it locked, so they might not be the
    # newest). None: not read (the ORM claim, a takeover).
    task: Task | None = field(default=None, compare=False, repr=False)
    cancel_open: bool | None = field(default=None, compare=False)
    stored: hotpath.Stored | None = field(default=None, compare=False, repr=False)


def _holder_alive() -> Q:
    """A lease's holder is alive: it names no liveness lock, or its lock is held (``pg_locks``)."""
    if not liveness.supported():
        return Q()
    return Q(holder_key__isnull=True) | Q(holder_key__in=RawSQL(liveness.HELD_KEYS_SQL, ()))


def live_lease_exists(now: datetime | None = None) -> Exists:
    """Subquery: the outer task has a lease that has not expired at ``now`` (default: the database's
    clock, as a claim judges) and whose holder lives."""
    at = Now() if now is None else now
    return Exists(Lease.objects.filter(_holder_alive(), task_id=OuterRef("pk"), expires_at__gt=at))


def _gone_holders(leases: list[Lease]) -> set[int]:
    """Of these leases' holder keys, the ones whose liveness lock is gone (one query, if any is asked)."""
    keys = {lease.holder_key for lease in leases if lease.holder_key is not None}
    if not keys or not liveness.supported():
        return set()
    with connection.cursor() as cursor:
        cursor.execute(liveness.HELD_KEYS_SQL)
        held = {row[0] for row in cursor.fetchall()}
    return keys - held


def _take(epochs: dict[UUID, int], worker_id: str, now: datetime, ttl: timedelta, region: str) -> list[Held]:
    """Inside a transaction holding these task rows: take each one's lease if none is live.

    ``epochs`` maps each task to the ownership epoch read with its row lock; each ``Held`` carries it.

    A few statements whatever the number of tasks: read (and lock) their lease
    rows, insert the missing ones together, move the reclaimable ones on to the
    next token together. Taking a lease that lapsed in another worker's hands
    (it stopped heartbeating, or its process is gone; it did not release)
    writes a ``LeaseTakeover`` record in the same transaction: who took it,
    from whom, and the token that went stale, chained on the task's takeover
    chain (``_chain``). Every lease row is created and
    moved under its task row's lock, so no other claimer races these writes.
    """
    expires = now + ttl
    holder_key = liveness.key()
    mine = {"worker_id": worker_id, "acquired_at": now, "heartbeat_at": now, "expires_at": expires,
            "holder_key": holder_key}  # fmt: skip
    # Lock the lease rows: a holder's heartbeat (an UPDATE) waits, then finds the token moved on.
    previous = {
        lease.task_id: lease for lease in Lease.objects.select_for_update().filter(task_id__in=list(epochs))
    }
    fresh = [Lease(task_id=task_id, token=1, **mine) for task_id in epochs if task_id not in previous]
    Lease.objects.bulk_create(fresh)
    held = [Held(lease.task_id, worker_id, 1, epochs[lease.task_id], region) for lease in fresh]
    live = [lease for lease in previous.values() if lease.expires_at > now]
    gone = _gone_holders(live)
    taken = [lease for lease in previous.values() if lease.expires_at <= now or lease.holder_key in gone]
    if not taken:
        return held
    # One UPDATE for them all: the rows are locked (FOR UPDATE above; SQLite: one writer at a time), so
    # each token is still the one read, and each moves on by exactly one.
    Lease.objects.filter(task_id__in=[lease.task_id for lease in taken]).update(token=F("token") + 1, **mine)
    held += [
        Held(lease.task_id, worker_id, lease.token + 1, epochs[lease.task_id], region) for lease in taken
    ]
    transaction.on_commit(functools.partial(metrics.leases_taken, taken, worker_id, now))  # lapses counted
    # release() ends a lease with heartbeat_at == expires_at; a lapsed one was still due a heartbeat.
    takeovers = [
        LeaseTakeover(
            task_id=lease.task_id,
            worker_id=worker_id,
            token=lease.token + 1,
            previous_worker_id=lease.worker_id,
            stale_token=lease.token,
            previous_heartbeat_at=lease.heartbeat_at,
            previous_expires_at=lease.expires_at,
            taken_at=now,
        )
        for lease in taken
        if lease.worker_id != worker_id and lease.heartbeat_at < lease.expires_at
    ]
    if takeovers:
        with tracer.start_as_current_span("lease.takeover") as span:
            _chain(takeovers)
            if span.is_recording():
                span.set_attributes(
                    {
                        "durable.worker.id": worker_id,
                        "durable.lease.count": len(takeovers),
                        "durable.task.ids": [str(t.task_id) for t in takeovers],
                        "durable.lease.previous_workers": sorted({t.previous_worker_id for t in takeovers}),
                    }
                )
    return held


def _chain(takeovers: list[LeaseTakeover]) -> None:
    """Write ``takeovers`` (one per task, rows locked by this claim) as links of their tasks' takeover
    chains, and move each task's ``takeover_head`` onto its new link.

    Why the head lives on the task row rather than only on the newest takeover: deleting the newest
    takeover must show without an anchor, and only something the deleter cannot also roll back to a
    consistent state shows it; the task row's head is read in the same snapshot as the chain
    (``audit.verify``). The head moves under the claim's row lock (``FOR UPDATE`` on the task), so two
    claims never link to the same head: the chain cannot fork. Only a takeover pays: reading the
    heads and moving them are two statements (plus the insert), an ordinary claim none.
    """
    heads = dict(
        Task.objects.filter(id__in=[t.task_id for t in takeovers]).values_list("id", "takeover_head")
    )
    key = current_chain_key()
    for takeover in takeovers:
        takeover.prev_hash = heads[takeover.task_id] or GENESIS
        takeover.key_id, takeover.hash = key.id, takeover_hash(takeover.prev_hash, takeover, key.secret)
    LeaseTakeover.objects.bulk_create(takeovers)
    Task.objects.filter(id__in=[t.task_id for t in takeovers]).update(
        takeover_head=Case(*(When(id=t.task_id, then=Value(t.hash)) for t in takeovers))
    )


def _claimed(span: trace.Span, worker_id: str, region: str, held: list[Held]) -> None:
    if span.is_recording():
        span.set_attributes(
            {"durable.worker.id": worker_id, "durable.region": region, "durable.lease.count": len(held)}
        )


def _refused(worker_id: str) -> bool:
    """Whether this process claims nothing now: its clock is too far off the database's (counted)."""
    if liveness.claims_refused() is None:
        return False
    metrics.claim_refused(worker_id, "clock_skew")
    return True


def claim(task_id: UUID | str, *, worker_id: str, region: str, ttl: timedelta = DEFAULT_TTL) -> Held | None:
    """Claim one task if it is runnable in ``region`` and nobody holds a live lease.

    Refuses (None) while this process's clock is too far off the database's (``liveness.claims_refused``).
    """
    if _refused(worker_id):
        return None
    with tracer.start_as_current_span("lease.claim", attributes={"durable.task.id": str(task_id)}) as span:
        if in_one_statement():
            held = _claim_statement(worker_id, region, 1, ttl, task_id=Task._meta.pk.to_python(task_id))
        else:
            held = _claim_orm(worker_id, region, 1, ttl, ids=[task_id])
        _claimed(span, worker_id, region, held)
    return held[0] if held else None


def claim_next(*, worker_id: str, region: str, limit: int = 1, ttl: timedelta = DEFAULT_TTL) -> list[Held]:
    """Claim up to ``limit`` runnable tasks of ``region`` without a live lease, oldest first.

    Refuses ([]) while this process's clock is too far off the database's (``liveness.claims_refused``).
    On PostgreSQL one statement (``_claim_statement``), elsewhere a transaction of a few (``_claim_orm``).
    """
    if _refused(worker_id):
        return []
    began = time.time_ns()
    if in_one_statement():
        return _claim_statement(worker_id, region, limit, ttl, began=began)
    return _claim_orm(worker_id, region, limit, ttl, began=began)


def in_one_statement() -> bool:
    """Whether claims are one statement here (PostgreSQL: data-modifying CTEs, ``SKIP LOCKED``)."""
    return connection.vendor == "postgresql"


def _claim_orm(
    worker_id: str,
    region: str,
    limit: int,
    ttl: timedelta,
    *,
    ids: Collection[UUID | str] | None = None,
    began: int | None = None,
) -> list[Held]:
    """The claim as a transaction of a few ORM statements: SQLite (the demo), and on PostgreSQL the
    takeovers the one statement leaves to it. ``ids``: only among these tasks. ``began``: open the
    claim's span (from then) when there were candidates; without it the caller has one open."""
    with transaction.atomic(durable=True):
        runnable = Task.objects.select_for_update(skip_locked=True, of=("self",)).filter(
            # Written by a newer deployment: its workers run it, ours would only have to let go.
            state__in=RUNNABLE,
            region=region,
            checkpoint_schema__lte=checkpoints.CURRENT_SCHEMA,
        )
        if ids is not None:
            runnable = runnable.filter(pk__in=list(ids))
        candidates = list(
            runnable.exclude(live_lease_exists())
            .annotate(database_now=Now())  # the claim's time, from the database's clock: the lapses use it
            .order_by("state_entered_at")
            .values_list("id", "ownership_epoch", "database_now")[:limit]
        )
        if not candidates:
            return []  # no span: an idle worker asks twice a second, and nothing happened
        now = candidates[0][2]
        epochs = {task_id: epoch for task_id, epoch, _ in candidates}
        if began is None:
            return _take(epochs, worker_id, now, ttl, region)
        # The span starts where the claim did (the query above is part of it).
        with tracer.start_as_current_span("lease.claim", start_time=began) as span:
            held = _take(epochs, worker_id, now, ttl, region)
            _claimed(span, worker_id, region, held)
        return held


@dataclass
class _Previous:
    """What a lease moved on by the one-statement claim was before (for ``metrics.leases_taken``)."""

    worker_id: str
    heartbeat_at: datetime
    expires_at: datetime


def _claim_statement(
    worker_id: str,
    region: str,
    limit: int,
    ttl: timedelta,
    *,
    task_id: UUID | None = None,
    began: int | None = None,
) -> list[Held]:
    """The claim in one statement (PostgreSQL, ``_build_claim_sql``), in autocommit: one round trip.

    The statement locks up to ``limit`` candidates (``FOR UPDATE SKIP LOCKED``, oldest first), inserts
    the lease rows they lack, moves on by one token the lease rows that are free to take without a
    takeover record (lapsed or holder gone, and given up by its holder or held by this worker), and
    returns each candidate's task row, new token and whether a cancel request is open. A candidate
    whose lease lapsed in another worker's hands is not taken by it: such a claim writes a chained
    ``LeaseTakeover`` (an HMAC computed here, ``_chain``) in the claim's transaction, so those few go
    through ``_claim_orm`` after it, under a row lock taken anew.
    """
    rows = _run_claim(worker_id, region, limit, ttl, task_id)
    if not rows:
        return []  # no span: an idle worker asks twice a second, and nothing happened
    held: list[Held] = []
    taken: list[_Previous] = []
    takeovers: list[UUID] = []
    for task, token, previous, cancel_open, takeover, _, stored in rows:
        if token is not None:
            held.append(
                Held(task.id, worker_id, token, task.ownership_epoch, region, task, cancel_open, stored)
            )
            if previous is not None:
                taken.append(previous)
        elif takeover:
            takeovers.append(task.id)
    now = rows[0][5]  # the statement's time, by the database's clock
    if taken:
        # Lapses counted (in autocommit the statement has committed: at once).
        transaction.on_commit(functools.partial(metrics.leases_taken, taken, worker_id, now))
    if began is None:  # claim(): its caller's span covers it
        return held + (_claim_orm(worker_id, region, len(takeovers), ttl, ids=takeovers) if takeovers else [])
    with tracer.start_as_current_span("lease.claim", start_time=began) as span:
        if takeovers:
            held += _claim_orm(worker_id, region, len(takeovers), ttl, ids=takeovers)
        _claimed(span, worker_id, region, held)
    return held


# The task as claimed (its tenant cached on it), its new token (None: not taken), what its lease was
# before if moved, whether a cancel request is open, whether it waits for a takeover, the statement's
# time, and the task's newest checkpoint with its vouching event if still the newest at that version.
_ClaimRow = tuple[Task, int | None, _Previous | None, bool, bool, datetime, hotpath.Stored | None]


def _run_claim(
    worker_id: str, region: str, limit: int, ttl: timedelta, task_id: UUID | None
) -> list[_ClaimRow]:
    sql, tasks, tenants, stored = _claim_statement_for(liveness.supported(), by_id=task_id is not None)
    params: dict[str, Any] = {
        "states": sorted(RUNNABLE),
        "region": region,
        "schema": checkpoints.CURRENT_SCHEMA,
        "limit": limit,
        "worker": worker_id,
        "ttl": ttl,
        "key": liveness.key(),
        "pending": CancelRequest.Status.PENDING.value,
        "task": task_id,
    }
    with hotpath.hot_cursor() as cursor:  # bound and planned once per connection (PostgreSQL)
        cursor.execute(sql, params)
        found = cursor.fetchall()
    rows: list[_ClaimRow] = []
    tenant_at = tasks.width
    stored_at = tenant_at + tenants.width
    rest = stored_at + stored.width
    for raw in found:
        task: Task = tasks.load(raw[:tenant_at])
        Task.tenant.field.set_cached_value(task, tenants.load(raw[tenant_at:stored_at]))
        snapshot, token, owner, beat, expiry, cancel_open, takeover, now = raw[rest:]
        # The task at another version in the statement's snapshot than the row it locked (a commit
        # between the statement's start and its lock): the checkpoint read may not be that version's newest.
        read = stored.load(raw[stored_at:rest], snapshot) if snapshot == task.state_version else None
        previous = _Previous(owner, beat, expiry) if owner else None  # what the lease was before
        rows.append((task, token, previous, bool(cancel_open), bool(takeover), now, read))
    return rows


_Statement = tuple[str, hotpath.Columns, hotpath.Columns, hotpath.StoredRead]
_statements: dict[tuple[str, bool, bool], _Statement] = {}


def _claim_statement_for(gone_check: bool, *, by_id: bool) -> _Statement:
    """The claim statement (built once per process and variant from the models' metadata) with what
    turns its columns into instances as the ORM would: the task's, its tenant's, and its newest
    checkpoint's and vouching event's (``hotpath.StoredRead``)."""
    key = (connection.vendor, gone_check, by_id)
    if key not in _statements:
        # Not the takeover head: an ordinary claim neither reads nor writes the takeover chain (a
        # ``Task`` built from these columns has it deferred).
        tasks = hotpath.Columns(Task, connection, defer=["takeover_head"])
        tenants = hotpath.Columns(Tenant, connection)
        stored = hotpath.StoredRead(connection)
        sql = _build_claim_sql(tasks, tenants, stored, gone_check=gone_check, by_id=by_id)
        _statements[key] = (sql, tasks, tenants, stored)
    return _statements[key]


def _build_claim_sql(
    tasks: hotpath.Columns,
    tenants: hotpath.Columns,
    stored: hotpath.StoredRead,
    *,
    gone_check: bool,
    by_id: bool,
) -> str:
    """The one-statement claim, in SQL. Its parts, each a CTE:

    ``candidates``  the oldest runnable tasks of the region (or the one asked for) without a live
                    lease, locked ``FOR UPDATE OF t SKIP LOCKED``: concurrent claimers never wait on
                    each other and never lock the same task (the no-double-claim property).
    ``previous``    their lease rows free to take without a takeover record, locked ``FOR UPDATE``
                    (a holder's heartbeat waits, then finds the token moved on); a row a heartbeat
                    extended meanwhile is re-checked at its newest version and left alone. Its
                    columns are what the lease was before, for the metrics.
    ``moved``       those rows moved to the next token (exactly one on: the row is locked).
    ``fresh``       the lease rows the candidates had none of, at token 1 (``ON CONFLICT DO
                    NOTHING``: one another claimer inserted since this statement's snapshot is its).

    Free to take: lapsed by the database's clock (``STATEMENT_TIMESTAMP()``, as ``Now()``), or
    its holder's liveness lock is gone (``gone_check``: ``tasks.liveness``); never a live lease of a
    live holder. A candidate left untaken because its lease lapsed in another worker's hands comes
    back with ``takeover`` set (``_claim_statement`` takes those with their takeover records).

    With each candidate it returns what its first step reads next: its tenant's row (``tn``), its
    newest checkpoint and the event vouching for it (``hotpath.StoredRead``: ``k`` and ``e``), and
    the task's version in the statement's snapshot, which those were read in. The row ``candidates``
    locked is the newest version of it, which may be newer than the snapshot (committed between the
    statement's start and its lock): ``_run_claim`` keeps the checkpoint only when the versions agree.
    """
    q = connection.ops.quote_name

    def col(model: Any, name: str) -> str:
        return str(q(model._meta.get_field(name).column))

    task, lease = q(Task._meta.db_table), q(Lease._meta.db_table)
    cancels = q(CancelRequest._meta.db_table)
    t_id, l_task, holder = col(Task, "id"), col(Lease, "task"), col(Lease, "holder_key")
    token, owner, beat = col(Lease, "token"), col(Lease, "worker_id"), col(Lease, "heartbeat_at")
    expires, status = col(Lease, "expires_at"), col(CancelRequest, "status")
    now = "STATEMENT_TIMESTAMP()"
    alive = f"(l.{holder} IS NULL OR l.{holder} IN ({liveness.HELD_KEYS_SQL}))" if gone_check else "TRUE"
    free = f"(l.{expires} <= {now} OR NOT {alive})"
    tenant, tenant_id = q(Tenant._meta.db_table), col(Task, "tenant")
    version = col(Task, "state_version")
    which = f"t.{t_id} = %(task)s" if by_id else "TRUE"
    return f"""
WITH candidates AS MATERIALIZED (
    SELECT {tasks.select("t")} FROM {task} t
    WHERE {which} AND t.{col(Task, "state")} = ANY(%(states)s) AND t.{col(Task, "region")} = %(region)s
      AND t.{col(Task, "checkpoint_schema")} <= %(schema)s
      AND NOT EXISTS (
          SELECT 1 FROM {lease} l WHERE l.{l_task} = t.{t_id} AND l.{expires} > {now} AND {alive})
    ORDER BY t.{col(Task, "state_entered_at")}
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
), previous AS MATERIALIZED (
    SELECT l.{l_task}, l.{owner}, l.{beat}, l.{expires}
    FROM {lease} l JOIN candidates c ON c.{t_id} = l.{l_task}
    WHERE {free} AND (l.{owner} = %(worker)s OR l.{beat} >= l.{expires})
    FOR UPDATE OF l
), moved AS (
    UPDATE {lease} l SET {token} = l.{token} + 1, {owner} = %(worker)s, {col(Lease, "acquired_at")} = {now},
        {beat} = {now}, {expires} = {now} + %(ttl)s, {holder} = %(key)s
    FROM previous p WHERE l.{l_task} = p.{l_task}
    RETURNING l.{l_task}, l.{token}
), fresh AS (
    INSERT INTO {lease} ({l_task}, {owner}, {token}, {col(Lease, "acquired_at")}, {beat}, {expires}, {holder})
    SELECT c.{t_id}, %(worker)s, 1, {now}, {now}, {now} + %(ttl)s, %(key)s FROM candidates c
    WHERE NOT EXISTS (SELECT 1 FROM {lease} l WHERE l.{l_task} = c.{t_id})
    ON CONFLICT ({l_task}) DO NOTHING
    RETURNING {l_task}, {token}
)
SELECT {tasks.select("c")}, {tenants.select("tn")}, {stored.select()},
    (SELECT s.{version} FROM {task} s WHERE s.{t_id} = c.{t_id}),
    COALESCE(m.{token}, f.{token}), p.{owner}, p.{beat}, p.{expires},
    EXISTS (SELECT 1 FROM {cancels} r
            WHERE r.{col(CancelRequest, "task")} = c.{t_id} AND r.{status} = %(pending)s),
    m.{l_task} IS NULL AND f.{l_task} IS NULL AND EXISTS (
        SELECT 1 FROM {lease} l WHERE l.{l_task} = c.{t_id} AND {free}
          AND l.{owner} <> %(worker)s AND l.{beat} < l.{expires}),
    {now}
FROM candidates c
LEFT JOIN moved m ON m.{l_task} = c.{t_id}
LEFT JOIN fresh f ON f.{l_task} = c.{t_id}
LEFT JOIN previous p ON p.{l_task} = c.{t_id}
LEFT JOIN {tenant} tn ON tn.{col(Tenant, "id")} = c.{tenant_id}
{stored.joined(f"c.{t_id}")}
ORDER BY c.{col(Task, "state_entered_at")}
"""


def fence(lease: Held, *, live: bool = True, at_version: int | None = None) -> Exists:
    """The condition a write made on a task's behalf carries in its own statement: ``lease``
    is still the task's lease (its token unchanged: nobody claimed the task since), the task
    is still owned at the lease's epoch (no failover since), if ``live`` the lease has not
    expired, and given ``at_version``, the task is still at that version (no cancel since)."""
    rows = Lease.objects.filter(
        task_id=lease.task_id, token=lease.token, worker_id=lease.worker_id, task__ownership_epoch=lease.epoch
    )
    if at_version is not None:
        rows = rows.filter(task__state_version=at_version)
    return Exists(rows.filter(expires_at__gt=Now()) if live else rows)


def heartbeat(lease: Held, *, ttl: timedelta = DEFAULT_TTL) -> bool:
    """Extend a lease still held with this token, to ``ttl`` from the database's now; False: it was lost."""
    return bool(
        Lease.objects.filter(task_id=lease.task_id, token=lease.token, expires_at__gt=Now()).update(
            heartbeat_at=Now(), expires_at=Now() + ttl
        )
    )


def heartbeat_all(held: Collection[Held], *, ttl: timedelta = DEFAULT_TTL) -> set[UUID]:
    """Extend each lease in ``held`` still held with its token (one UPDATE); return the lost ones' task ids.

    A second query runs only when some were lost, to tell which: those still live with their token
    (one not extended had lapsed or been taken, and neither comes back).
    """
    if not held:
        return set()
    mine = Q()
    for lease in held:
        mine |= Q(task_id=lease.task_id, token=lease.token)
    extended = Lease.objects.filter(mine, expires_at__gt=Now()).update(
        heartbeat_at=Now(), expires_at=Now() + ttl
    )
    if extended == len(held):
        return set()
    kept = set(Lease.objects.filter(mine, expires_at__gt=Now()).values_list("task_id", flat=True))
    return {lease.task_id for lease in held} - kept


def release(lease: Held, *, hold: timedelta | None = None) -> None:
    """Give the lease up (the row stays, so tokens keep growing): at once, or after ``hold``.

    A hold keeps other workers (and the sweep's doorbell) off a task that has
    nothing to do for a while, e.g. a cancel waiting for an effect that may
    still land, instead of claiming it again in a tight loop.
    """
    # heartbeat_at == expires_at marks a lease given up, not lapsed: the next claim is no takeover.
    if connection.vendor == "postgresql":
        params: dict[str, Any] = {"hold": hold or timedelta(0), "task": lease.task_id, "token": lease.token}
        with hotpath.hot_cursor() as cursor:
            cursor.execute(_release_sql(), params)
        return
    until = Now() + hold if hold else Now()  # one statement: both columns get the same database time
    Lease.objects.filter(task_id=lease.task_id, token=lease.token).update(
        expires_at=until, heartbeat_at=until
    )


@functools.cache
def _release_sql() -> str:
    """``release``'s ``UPDATE`` on PostgreSQL, written once from the model: the ORM built it anew at
    every call (about a third of a millisecond of a worker's CPU). Both columns take the statement's
    time, as ``Now()`` would."""
    quote = connection.ops.quote_name
    meta: Any = Lease._meta  # its concrete fields only: each has a column

    def column(name: str) -> str:
        return str(quote(meta.get_field(name).column))

    until = "STATEMENT_TIMESTAMP() + %(hold)s::interval"
    return (
        f"UPDATE {quote(meta.db_table)}"
        f" SET {column('expires_at')} = {until}, {column('heartbeat_at')} = {until}"
        f" WHERE {column('task')} = %(task)s::uuid AND {column('token')} = %(token)s::bigint"
    )


def end_hold(task_id: UUID | str) -> None:
    """End the hold ``release(hold=…)`` left on a task, if it has one: something it waited for happened."""
    Lease.objects.filter(task_id=task_id, heartbeat_at=F("expires_at"), expires_at__gt=Now()).update(
        expires_at=Now(), heartbeat_at=Now()
    )


def release_abandoned(worker_id: str, *, task_id: UUID | str | None = None) -> int:
    """Let the live leases ``worker_id`` left behind lapse now (only ``task_id``'s if given); count them.

    For a holder known to have stopped working on them: a worker whose database
    connection broke mid-task, or a pool process that died. Without this their
    tasks would wait out the TTL before anyone could resume them. The lease
    lapses as if its TTL had run out (``heartbeat_at`` is left alone, so the next
    claim counts as a takeover, not a clean release). Safe even if the holder
    were still at work: the token stays, so its next write is fenced off.
    """
    # A lease given up with a hold (heartbeat_at == expires_at) was not abandoned: it keeps its hold.
    abandoned = Lease.objects.filter(
        worker_id=worker_id, expires_at__gt=Now(), heartbeat_at__lt=F("expires_at")
    )
    if task_id is not None:
        abandoned = abandoned.filter(task_id=task_id)
    with tracer.start_as_current_span("lease.expire") as span:
        count = abandoned.update(expires_at=Now())
        if span.is_recording():
            span.set_attributes({"durable.worker.id": worker_id, "durable.lease.count": count})
    return count
