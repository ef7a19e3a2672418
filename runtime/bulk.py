"""Bulk operator actions: one control over many tasks, with one reason, tracked as a batch.

``bulk_create`` snapshots what the operator confirmed (each task at its version
then) into ``pending`` results. ``bulk_run`` settles them: every task goes through
``controls.task_control`` at the confirmed version, so a task that moved since is
recorded ``stale`` and left alone — a bulk action never overwrites. Small
operations run in the request; larger ones (over ``BULK_SYNC_LIMIT``) are rung to a
Celery worker (``runtime.workers.bulk_run``) and picked up by ``run_worker``'s
loop too (``run_pending``): whoever claims the operation first runs it, in
batches of ``CHUNK``, moving the operation's progress counters after each.

Durable: the confirmation records each selected task at its version in one ``BulkSnapshot`` row (one
``INSERT … SELECT`` aggregating the selection's own query, no task read into Python); the results
are written out from it, ``pending``, in the request for an operation it runs and by the first runner
for a larger one (one statement, which deletes the snapshot as it writes them, so only one runner
ever does). The runner needs none of the queue's filters: the selection was resolved when the
operator confirmed. Each result is settled once (only a ``pending`` row is written), and a
runner killed mid-batch is taken over after ``RUNNER_TIMEOUT``; the one task it may
have acted on without settling the result is found by its transition's reason
(which names the operation), recorded ``applied``, and never acted on twice (the
confirmed version has moved, so the control would be refused anyway).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from audit.models import TransitionEvent
from config.celery import app
from runtime import controls
from runtime.models import BulkOperation, BulkResult, BulkSnapshot, BulkStatus, Outcome
from tasks import services
from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.states import ActorKind
from tasks.transitions import Actor
from tenancy.models import Role
from tenancy.selectors import roles_by_tenant

log = logging.getLogger(__name__)

CHUNK = 50  # results settled between two progress updates
# A runner whose heartbeat is older than this is presumed dead: another may take the operation over.
RUNNER_TIMEOUT = timedelta(seconds=120)
OPERATE_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})
# The task controls, and a rerun: not a control of the task (a finished task is never written) but a new
# task that runs it again (``tasks.services.task_rerun``), once per task of the operation.
RERUN = "rerun"
CONTROLS = (*controls.CONTROLS, RERUN)


def sync_limit() -> int:
    """Up to this many tasks run in the confirming request; more go to a worker (``BULK_SYNC_LIMIT``)."""
    return int(settings.BULK_SYNC_LIMIT)


def max_tasks() -> int:
    """One operation's ceiling: past it, the operator narrows the filter (``BULK_MAX_TASKS``)."""
    return int(settings.BULK_MAX_TASKS)


class BulkRefused(Exception):
    """The operation was not created (no reason, unknown control, nothing or too much selected)."""


def bulk_create(
    *,
    user: Any,
    control: str,
    reason: str,
    tasks: QuerySet[Task],
    selection: dict[str, Any],
    scope: str = "",
    escalate_to: str = "",
    now: datetime | None = None,
) -> BulkOperation:
    """Record the operation and each task of ``tasks`` at its current version.

    ``tasks`` is already scoped to what ``user`` may see (the caller's selector).
    Refuses (``BulkRefused``) an unknown control, a blank reason, an empty
    selection or more than ``max_tasks()`` tasks. The selection is kept as one
    snapshot row (each task's id, tenant and version as the statement reads them),
    so a selection of 233,114 tasks never passes through Python. Up to
    ``sync_limit()`` tasks, the ``pending`` results are written from it here, for the
    caller to run; a larger operation rings a worker after commit, and its first
    runner writes them (the request writes one row however many tasks match).
    """
    reason = reason.strip()
    if control not in CONTROLS:
        raise BulkRefused(f"No such control: {control}")
    if not reason:
        raise BulkRefused("A reason is required.")
    ceiling = max_tasks()
    with transaction.atomic():
        operation = BulkOperation.objects.create(
            created_by=user,
            created_by_name=user.get_username(),
            created_at=now or timezone.now(),
            control=control,
            reason=reason,
            scope=scope if control == "cancel" else "",
            escalate_to=escalate_to if control == "escalate" else "",
            selection=selection,
            total=0,
        )
        total = _snapshot(operation, tasks, limit=ceiling + 1)
        if not total:  # raised inside the transaction: the operation is not kept
            raise BulkRefused("No tasks are selected.")
        if total > ceiling:
            raise BulkRefused(f"More than {ceiling:,} tasks match: narrow the filter.")
        BulkOperation.objects.filter(pk=operation.pk).update(total=total)
        operation.total = total
        if total > sync_limit():
            transaction.on_commit(functools.partial(ring, operation.id))
        else:
            _write_results(operation.pk)
    return operation


def _snapshot(operation: BulkOperation, tasks: QuerySet[Task], *, limit: int) -> int:
    """Each task of ``tasks`` (at most ``limit``) at its current version, as ``operation``'s one snapshot
    row, aggregated by the database from the selection's own query, with the distinct tenants they
    belong to (who may read the operation before its results exist). Returns how many."""
    chosen = tasks.order_by("id").values("id", "tenant_id", "state_version")[:limit]
    sql, params = chosen.query.sql_with_params()
    table = BulkSnapshot._meta.db_table
    if connection.vendor == "postgresql":
        body = (
            "COALESCE(jsonb_agg(jsonb_build_array(chosen.id, chosen.tenant_id, chosen.state_version) "
            "ORDER BY chosen.id), '[]'::jsonb)"
        )
        tenants = "COALESCE(jsonb_agg(DISTINCT chosen.tenant_id), '[]'::jsonb)"
        length = "jsonb_array_length(body)"
    else:  # SQLite (the embedded demo): the subquery's order is the aggregate's
        body = "json_group_array(json_array(chosen.id, chosen.tenant_id, chosen.state_version))"
        tenants = "json_group_array(DISTINCT chosen.tenant_id)"
        length = "json_array_length(body)"
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (operation_id, body, tenant_ids) SELECT %s, {body}, {tenants} "  # noqa: S608 - no input in the names
            f"FROM ({sql}) chosen RETURNING {length}",
            [_key(operation.pk), *params],
        )
        return int(cursor.fetchone()[0])


def _write_results(operation_id: UUID) -> int:
    """Write out the operation's snapshot as one ``pending`` result per task, in task id order, and
    delete it: one statement on PostgreSQL, so two runners racing here write the results once (the
    second finds the snapshot gone). Returns the results written (0 when they were written already)."""
    results, snapshots = BulkResult._meta.db_table, BulkSnapshot._meta.db_table
    columns = "operation_id, task_id, tenant_id, expected_version, outcome, detail, state_after"
    key = _key(operation_id)
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"WITH taken AS (DELETE FROM {snapshots} WHERE operation_id = %s RETURNING body) "  # noqa: S608
                f"INSERT INTO {results} ({columns}) "
                "SELECT %s, (e.value->>0)::uuid, (e.value->>1)::integer, (e.value->>2)::integer, %s, '', '' "
                "FROM taken, jsonb_array_elements(taken.body) WITH ORDINALITY AS e(value, n) ORDER BY e.n",
                [key, key, Outcome.PENDING],
            )
            return int(cursor.rowcount)
        # SQLite serialises writers (its transactions take the write lock as they begin).
        cursor.execute(
            f"INSERT INTO {results} ({columns}) "  # noqa: S608
            "SELECT s.operation_id, json_extract(e.value, '$[0]'), json_extract(e.value, '$[1]'), "
            "json_extract(e.value, '$[2]'), %s, '', '' "
            f"FROM {snapshots} s, json_each(s.body) e WHERE s.operation_id = %s ORDER BY e.key",
            [Outcome.PENDING, key],
        )
        written = int(cursor.rowcount)
        cursor.execute(f"DELETE FROM {snapshots} WHERE operation_id = %s", [key])  # noqa: S608
        return written


def _key(operation_id: UUID) -> Any:
    """The operation's id as a raw statement binds it (SQLite keeps a UUID as its hex)."""
    return operation_id.hex if connection.vendor == "sqlite" else operation_id


def ring(operation_id: UUID) -> None:
    """Wake a Celery worker for a large operation. Best effort: ``run_worker`` finds it anyway."""
    try:
        app.send_task("runtime.bulk_run", args=[str(operation_id)], retry=False)
    except Exception:  # a broker outage must never fail the request that committed the operation
        log.warning("bulk doorbell failed; run_worker will pick the operation up", exc_info=True)


@dataclass(frozen=True)
class _Settled:
    outcome: Outcome
    detail: str = ""
    state: str = ""  # the task's state and version as the control left (or found) it
    version: int | None = None


def bulk_run(
    operation_id: UUID | str,
    *,
    runner: str,
    budget: int | None = None,
    clock: Callable[[], datetime] = timezone.now,
) -> BulkOperation:
    """Settle the operation's pending results; return it as it stands afterwards.

    1. claim it: ``queued``, already ours, or ``running`` under a runner silent for
       ``RUNNER_TIMEOUT`` (it died); otherwise someone else runs it — return;
    2. write out the results from the confirmation's snapshot if no runner has yet,
       then recount the settled results into the progress counters once (a runner
       that died may have settled some after its last update);
    3. take the next ``CHUNK`` pending results (id order) and apply the control to
       each at its confirmed version, settling each result once; add what this
       runner settled to the counters and beat the heartbeat (one ``UPDATE``); a
       runner that lost its claim stops here;
    4. repeat until none is pending (``done``) or ``budget`` results were settled.
    Must not run inside a transaction: each control is its own durable commit.
    """
    now = clock()
    before = BulkOperation.objects.filter(pk=operation_id).values("status", "runner", "heartbeat_at").first()
    # Our own claim, still fresh: the counters are ours and current. Otherwise another runner (or this
    # one, before it was interrupted) may have settled results after its last progress update.
    continuing = bool(
        before
        and before["status"] == BulkStatus.RUNNING
        and before["runner"] == runner
        and before["heartbeat_at"] is not None
        and before["heartbeat_at"] >= now - RUNNER_TIMEOUT
    )
    claimed = (
        BulkOperation.objects.filter(pk=operation_id)
        .filter(
            Q(status=BulkStatus.QUEUED)
            | Q(status=BulkStatus.RUNNING, runner=runner)
            | Q(status=BulkStatus.RUNNING, heartbeat_at__lt=now - RUNNER_TIMEOUT)
        )
        .update(status=BulkStatus.RUNNING, runner=runner, heartbeat_at=now)
    )
    operation = BulkOperation.objects.get(pk=operation_id)
    if not claimed:
        return operation
    user = None
    if operation.created_by_id is not None:  # an account deleted since: every task is refused
        user = get_user_model().objects.filter(pk=operation.created_by_id).first()
    # Every call, not only a fresh claim's: a runner whose claim is still fresh may have died writing
    # them (the statement rolled back). One statement, a no-op once they are written.
    _write_results(operation.pk)
    if not continuing and not _recount(operation, runner, now=clock()):
        operation.refresh_from_db()
        return operation
    settled = 0
    while budget is None or settled < budget:
        size = CHUNK if budget is None else min(CHUNK, budget - settled)
        chunk = list(operation.results.filter(outcome=Outcome.PENDING).order_by("id")[:size])
        mine: dict[str, int] = {}
        for result in chunk:
            outcome = _settle(result, _apply(operation, result, user), clock())
            if outcome:
                mine[outcome] = mine.get(outcome, 0) + 1
        settled += len(chunk)
        still_ours = _record_progress(operation, runner, mine, finished=len(chunk) < size, now=clock())
        if not still_ours or len(chunk) < size:
            break
    operation.refresh_from_db()
    return operation


def run_pending(runner: str, *, budget: int = CHUNK * 4) -> int:
    """``run_worker``'s share: advance the oldest claimable unfinished operation. Returns results settled."""
    now = timezone.now()
    operation = (
        BulkOperation.objects.exclude(status=BulkStatus.DONE)
        .filter(
            # Small operations run in their request: only one whose request died is ours to finish.
            Q(status=BulkStatus.QUEUED, total__gt=sync_limit())
            | Q(status=BulkStatus.QUEUED, created_at__lt=now - RUNNER_TIMEOUT)
            | Q(runner=runner)
            | Q(status=BulkStatus.RUNNING, heartbeat_at__lt=now - RUNNER_TIMEOUT)
        )
        .order_by("created_at")
        .first()
    )
    if operation is None:
        return 0
    before = operation.done
    return bulk_run(operation.id, runner=runner, budget=budget).done - before


def _apply(operation: BulkOperation, result: BulkResult, user: Any) -> _Settled:
    task = Task.objects.filter(pk=result.task_id).first()
    if task is None:
        return _Settled(Outcome.REFUSED, "the task no longer exists")
    roles = roles_by_tenant(user).get(task.tenant_id, frozenset()) if user is not None else frozenset()
    if not roles & OPERATE_ROLES:
        return _Settled(
            Outcome.REFUSED, "no operator or admin role in the task's tenant", task.state, task.state_version
        )
    if operation.control == RERUN:
        return _rerun(operation, result, task, user)
    options: dict[str, str] = {}
    if operation.scope:
        options["scope"] = operation.scope
    if operation.escalate_to:
        options["escalate_to"] = operation.escalate_to
    try:
        done = controls.task_control(
            task,
            operation.control,
            user=user,
            roles=roles,
            expected_version=result.expected_version,
            reason=f"{operation.reason} (bulk {operation.id})",
            **options,
        )
    except StaleVersion as exc:
        if _applied_before(operation, result):
            return _Settled(
                Outcome.APPLIED,
                "applied by an earlier runner of this operation, which stopped before recording it",
                exc.state or "",
                exc.state_version,
            )
        return _Settled(
            Outcome.STALE,
            f"changed since confirmed: now {exc.state} v{exc.state_version}, "
            f"confirmed at v{result.expected_version}",
            exc.state or "",
            exc.state_version,
        )
    except TransitionNotAllowed as exc:
        return _Settled(Outcome.REFUSED, str(exc), exc.state or task.state, exc.state_version)
    except CheckpointUnreadable as exc:
        return _Settled(
            Outcome.REFUSED,
            f"checkpoint unreadable ({exc.reason}: {exc.detail})",
            task.state,
            task.state_version,
        )
    outcome = Outcome.APPLIED if done.applied else Outcome.UNCHANGED
    return _Settled(outcome, done.note, done.task.state, done.task.state_version)


def _rerun(operation: BulkOperation, result: BulkResult, task: Task, user: Any) -> _Settled:
    """A new task that reruns ``task``, keyed by (operation, task): a runner that took the operation over
    finds the rerun its predecessor started instead of starting a second one."""
    if task.state_version != result.expected_version:
        return _Settled(
            Outcome.STALE,
            f"changed since confirmed: now {task.state} v{task.state_version}, "
            f"confirmed at v{result.expected_version}",
            task.state,
            task.state_version,
        )
    try:
        rerun, created = services.task_rerun(
            task,
            actor=Actor.user(user, ActorKind.OPERATOR),
            reason=f"{operation.reason} (bulk {operation.id})",
            idempotency_key=f"bulk:{operation.id}:{task.id}",
        )
    except (TransitionNotAllowed, services.InvalidTaskInput, services.IdempotencyConflict) as exc:
        return _Settled(Outcome.REFUSED, str(exc), task.state, task.state_version)
    note = f"rerun as task {rerun.id}" if created else f"already rerun as task {rerun.id}"
    return _Settled(Outcome.APPLIED if created else Outcome.UNCHANGED, note, task.state, task.state_version)


def _applied_before(operation: BulkOperation, result: BulkResult) -> bool:
    """Whether this operation itself moved the task off its confirmed version: a runner that died
    between the control's commit and ``_settle`` left its transition, whose reason names the operation."""
    return TransitionEvent.objects.filter(
        task_id=result.task_id,
        state_version=result.expected_version + 1,
        reason=f"{operation.reason} (bulk {operation.id})",
    ).exists()


def _settle(result: BulkResult, settled: _Settled, now: datetime) -> str:
    """Write the result once: a pending row only, so a taken-over operation never rewrites one.
    Returns the outcome written, or "" when the row was settled already (by another runner)."""
    written = BulkResult.objects.filter(pk=result.pk, outcome=Outcome.PENDING).update(
        outcome=settled.outcome,
        detail=settled.detail[:2000],
        state_after=settled.state,
        version_after=settled.version,
        settled_at=now,
    )
    return str(settled.outcome) if written else ""


SETTLED = (Outcome.APPLIED, Outcome.UNCHANGED, Outcome.REFUSED, Outcome.STALE)


def _counted(operation: BulkOperation) -> dict[str, Any]:
    """The counters from the results themselves: one GROUP BY on the operation's index."""
    rows = operation.results.values("outcome").annotate(n=Count("id")).order_by()
    counts = {row["outcome"]: row["n"] for row in rows}
    fields: dict[str, Any] = {outcome.value: counts.get(outcome.value, 0) for outcome in SETTLED}
    fields["done"] = sum(fields.values())
    return fields


def _recount(operation: BulkOperation, runner: str, *, now: datetime) -> bool:
    """Counters from the results, once per claim; ``False`` when the claim was lost meanwhile."""
    return bool(
        BulkOperation.objects.filter(pk=operation.pk, status=BulkStatus.RUNNING, runner=runner).update(
            **_counted(operation), heartbeat_at=now
        )
    )


def _record_progress(
    operation: BulkOperation, runner: str, mine: dict[str, int], *, finished: bool, now: datetime
) -> bool:
    """Add the results this runner settled in its last batch to the counters, and beat the heartbeat:
    one ``UPDATE`` whatever the operation's size. The last batch marks the operation done with the
    counters recounted from the results (a runner taken over may have settled some after our recount)."""
    fields: dict[str, Any]
    if finished:
        fields = {**_counted(operation), "status": BulkStatus.DONE, "finished_at": now}
    else:
        fields = {outcome: F(outcome) + n for outcome, n in mine.items()}
        fields["done"] = F("done") + sum(mine.values())
    fields["heartbeat_at"] = now
    return bool(
        BulkOperation.objects.filter(pk=operation.pk, status=BulkStatus.RUNNING, runner=runner).update(
            **fields
        )
    )
