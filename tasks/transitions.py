"""The only code that writes a task's ``state`` and ``state_version``.

``task_start`` inserts a task at version 1; ``advance`` moves it along one edge
of ``tasks.states.TRANSITIONS``. Each is one durable transaction holding the
task row change, its checkpoint, its audit event and its ledger (outbox) rows:
either all of them commit or none does. On PostgreSQL a commit with nothing of
its caller's to run inside it is one statement (the rows ride on the
compare-and-set, ``tasks.hotpath.compare_and_set(inserts=…)``), sent on its own
without ``BEGIN``/``COMMIT``: one round trip.

What runs besides the kernel's own code, and when, is named at the call site
or declared in ``tasks.hooks``; nothing is connected invisibly:

- ``records=`` and ``also=`` of ``advance`` are rows and writes the *caller*
  hands over, to commit in the transition's one transaction or not at all
  (``approvals.services`` passes its request and the permission grant, or the
  decision and the request's settlement; the engine its guarded writes). They
  are the caller's own code in the caller's own layer, visible where it calls:
  the kernel imports nothing of it and looks nothing up. Kept as they are, since
  splitting them out would break the one-transaction promise above.
- After a terminal commit, the hooks registered at ``tasks.hooks.after_task_ended``
  run, in their listed order (``tasks.apps``: the parent's wake-up, then the
  cancellation of the task's own running children). The kernel cannot call
  those directly: they advance tasks themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import models, transaction
from django.db.models import Case, Q, Value, When
from django.utils import timezone
from opentelemetry import trace

from audit import sealing
from audit.chain import GENESIS
from audit.keys import chain_link
from audit.models import TransitionEvent
from audit.redaction import redact
from ledger import integrity, keys
from ledger.models import Action
from tasks import audit_paths, checkpoints, effect_keys, hooks, hotpath, metrics, registry
from tasks.exceptions import LeaseLost, StaleEpoch, StaleVersion, TaskNotFound, TransitionNotAllowed
from tasks.leases import Held
from tasks.models import CancelRequest, CancelScope, Checkpoint, ExternalEvent, Task
from tasks.states import TERMINAL, WAITING, ActorKind, State, Trigger, find_edge

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
CHILD_ENDED = "child_ended"  # the event type of a child's end, for its parent


@dataclass(frozen=True)
class Actor:
    """Who pulls a trigger: a kind from the table and a stable id for the audit log."""

    kind: ActorKind
    id: str

    @classmethod
    def system(cls, name: str) -> Actor:
        return cls(ActorKind.SYSTEM, f"system:{name}")

    @classmethod
    def worker(cls, worker_id: str) -> Actor:
        return cls(ActorKind.WORKER, f"worker:{worker_id}")

    @classmethod
    def user(cls, user: Any, kind: ActorKind) -> Actor:
        return cls(kind, f"user:{user.get_username()}")


@dataclass(frozen=True)
class ActionIntent:
    """A side effect the transition commits to (an outbox row in the ledger)."""

    step: str
    connector: str
    effect: Mapping[str, Any] = field(default_factory=dict)
    compensates: int | None = None  # the action this one undoes

    @property
    def digest(self) -> str:
        # The one digest of an effect, which the dispatcher recomputes before sending (ledger.integrity).
        return integrity.effect_digest(self.effect)

    def idempotency_key(self, scope: keys.Scope | UUID) -> str:
        """The key of this effect in ``scope`` (``tasks.effect_keys.scope_of`` of its task; a task id:
        the ``TASK`` scheme). Deterministic from scope + step + effect: re-deciding the same step with
        the same effect yields the same key, which the ledger's unique index holds."""
        within = scope if isinstance(scope, keys.Scope) else keys.task_scope(scope)
        return within.key(self.step, self.digest)


# Task fields a transition may change besides state, version and timestamps.
CHANGEABLE = frozenset(
    {
        "wait_deadline",
        "attempt",
        "outcome",
        "escalation_level",
        "escalated_to",
        "escalation_reason",
        "policy_version",
        "model_id",
        "prompt_id",
        "toolset_id",
        # Ownership: only a failover moves these (``_advance`` refuses them on any other trigger).
        "region",
        "ownership_epoch",
    }
)
# Every column the compare-and-set writes (state_version is bumped in SQL). ``checkpoint_schema``
# changes only with a checkpoint (``_checkpoint_for``); otherwise it is written back as read.
WRITTEN = (
    "state", "state_reason", "updated_at", "state_entered_at", "audit_head", "checkpoint_schema",
    *sorted(CHANGEABLE),
)  # fmt: skip
OWNERSHIP = frozenset({"region", "ownership_epoch"})
# What every other transition writes: ownership is guarded (WHERE ownership_epoch = …), never rewritten.
ROUTINE_WRITTEN = tuple(name for name in WRITTEN if name not in OWNERSHIP)


def span_attributes(task: Task) -> dict[str, Any]:
    """What every span about a task carries (``durable.*``): ids, type, tenant, version, attempt.

    Identifiers and counters only, never input, facts or reasons: spans leave the process.
    """
    attributes: dict[str, Any] = {
        "durable.task.id": str(task.id),
        "durable.task.type": task.task_type,
        "durable.tenant.id": task.tenant_id,
        "durable.task.state_version": task.state_version,
        "durable.task.attempt": task.attempt,
    }
    if task.parent_id is not None:
        attributes["durable.task.parent_id"] = str(task.parent_id)
    return attributes


def _transition_attributes(task: Task, from_state: str, trigger: str, actor: Actor) -> dict[str, Any]:
    return {
        **span_attributes(task),
        "durable.transition.trigger": str(trigger),
        "durable.transition.from_state": str(from_state),
        "durable.transition.to_state": str(task.state),
        "durable.transition.actor_kind": str(actor.kind),
    }


def _trace_ids() -> tuple[str, str]:
    """(trace id, W3C traceparent) of the current span, or blanks without one."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return "", ""
    trace_id = format(context.trace_id, "032x")
    return trace_id, f"00-{trace_id}-{format(context.span_id, '016x')}-{int(context.trace_flags):02x}"


def _checkpoint_for(
    task: Task, progress: checkpoints.Progress, actions: list[Action], trace_link: str
) -> Checkpoint:
    """The checkpoint row for ``task`` at its new version, at ``CURRENT_SCHEMA``; the task row records
    that schema (``checkpoint_schema``) in the same write, so workers of an older deployment skip it."""
    fields = dict(
        **progress.model_dump(),
        task_id=task.id,
        state=State(task.state),
        state_version=task.state_version,
        pending_actions=[
            checkpoints.PendingAction(
                idempotency_key=a.idempotency_key,
                step=a.step,
                connector=a.connector,
                effect_digest=a.effect_digest,
            )
            for a in actions
        ],
        policy_version=task.policy_version,
        runtime_config=checkpoints.RuntimeConfig(
            model=task.model_id, prompt=task.prompt_id, tool_set=task.toolset_id
        ),
        trace_link=trace_link,
        deployment=settings.DEPLOYMENT_ID,
        attempt=task.attempt,
        created_at=task.created_at,
        state_entered_at=task.state_entered_at,
        wait_deadline=task.wait_deadline,
        deadline=task.deadline,
        region=task.region,
        ownership_epoch=task.ownership_epoch,
    )
    # Only what the current contract has: the same code writes an older schema under an older contract.
    contract = checkpoints.Checkpoint.model_fields
    document = checkpoints.Checkpoint(**{name: value for name, value in fields.items() if name in contract})
    task.checkpoint_schema = checkpoints.CURRENT_SCHEMA
    body = checkpoints.encode(document, sealed=registry.sensitive_fields(task.task_type))
    # Refused here rather than on the next load: never commit a checkpoint no worker will read.
    # (The body is ASCII, canonical.V1_ASCII escapes the rest: characters are bytes.)
    limit = checkpoints.max_bytes()
    if len(body) > limit:
        raise ValueError(f"{checkpoints.CheckpointUnreadable.TOO_LARGE}: {len(body)} bytes, limit {limit}")
    return Checkpoint(
        task=task,
        state_version=task.state_version,
        schema_version=checkpoints.CURRENT_SCHEMA,
        codec=checkpoints.CODEC,
        body=body,
        digest=checkpoints.digest(body),
        created_at=task.updated_at,
    )


def _event_for(
    task: Task,
    *,
    from_state: str,
    trigger: str,
    actor: Actor,
    reason: str,
    reason_code: str,
    trace_id: str,
    checkpoint: Checkpoint | None,
) -> TransitionEvent:
    fields = {
        "task_id": task.id,
        "tenant_id": task.tenant_id,
        "state_version": task.state_version,
        "from_state": from_state,
        "to_state": task.state,
        "trigger": trigger,
        "actor_kind": actor.kind,
        "actor_id": actor.id,
        # The one place a reason enters the append-only log: whatever an exception said, no
        # credential, token or sensitive value is kept there for good.
        "reason": redact(reason),
        "reason_code": reason_code,
        "attempt": task.attempt,
        "policy_version": task.policy_version,
        "parent_id": task.parent_id,
        "trace_id": trace_id,
        # Binds the checkpoint to the chain: its body cannot change without breaking this hash.
        "checkpoint_digest": checkpoint.digest if checkpoint is not None else "",
        "created_at": task.updated_at,
    }
    prev_hash = task.audit_head or GENESIS
    key_id, link = chain_link(prev_hash, fields)  # keyed with AUDIT_HMAC_KEYS' current key (audit.keys)
    return TransitionEvent(**fields, prev_hash=prev_hash, hash=link, key_id=key_id)


def _ledger_rows(task: Task, intents: Iterable[ActionIntent], now: datetime) -> list[Action]:
    # The digest and key are of the effect as sent; the row keeps its sensitive keys sealed.
    intents = list(intents)
    if not intents:
        return []
    scope = effect_keys.scope_of(task)  # and the row records which scheme its key is of
    return [
        Action(
            task=task,
            step=intent.step,
            idempotency_key=intent.idempotency_key(scope),
            key_scheme=scope.scheme,
            connector=intent.connector,
            effect=sealing.seal_fields(
                intent.effect,
                registry.sensitive_effect_keys(task.task_type, intent.step),
                (*sealing.action_place(intent.idempotency_key(scope)), "effect"),
            ),
            effect_digest=intent.digest,
            compensation_of_id=intent.compensates,
            created_at=now,
            updated_at=now,
        )
        for intent in intents
    ]


def _write_history(
    event: TransitionEvent,
    checkpoint: Checkpoint | None,
    actions: list[Action],
    records: Iterable[models.Model] = (),
) -> None:
    """Every row a transition adds besides the task update, inside its transaction."""
    hotpath.insert(event)
    if checkpoint is not None:
        hotpath.insert(checkpoint)
    if actions:
        Action.objects.bulk_create(actions)
    for record in records:
        record.save(force_insert=True)


def _child_ended_event(child: Task) -> ExternalEvent:
    """The parent's record of how ``child`` ended, for the child's terminal commit.

    Locks the parent's row first. A parent deciding to (go on) wait(ing) holds
    that lock from its compare-and-set to its commit, and checks inside it that
    a child still runs (``tasks.children.none_running_guard``). So either the
    parent sees this child ended and does not wait, or it commits its wait
    before the ``after_task_ended`` hook (``tasks.children``) looks at it: it is never left waiting
    on nothing.
    """
    parent_id = child.parent_id
    assert parent_id is not None
    Task.objects.select_for_update().filter(pk=parent_id).values_list("pk").first()
    return ExternalEvent(
        task_id=parent_id,
        event_key=f"{CHILD_ENDED}:{child.id}",
        event_type=CHILD_ENDED,
        payload={
            "child": str(child.id),
            "task_type": child.task_type,
            "state": child.state,
            "reason": child.state_reason,
        },  # fmt: skip
        received_at=child.updated_at,
    )


def _end_answers(task: Task, now: datetime) -> hotpath.CancelAnswers:
    """How a task's end answers its open cancel requests: a confirmed cancel applied its own, the
    rest found nothing left to stop."""
    other = (CancelRequest.Status.NO_EFFECT, f"the task ended {task.state} first")
    own = (CancelRequest.Status.APPLIED, "the task was canceled") if task.state == State.CANCELED else other
    return hotpath.CancelAnswers(*own, *other, resolved_at=now)


def _close_cancel_requests(task: Task, now: datetime, *, ended: bool) -> None:
    """Answer the open cancel requests a move settles (one UPDATE).

    A task's end answers them all (``_end_answers``; usually folded into the end's own
    compare-and-set instead, ``_advance``). A task that leaves ``cancel_requested`` otherwise
    (quarantined, say) ends its ``task`` request: that cancel did not happen, and a later one is
    a request of its own.
    """
    requests = CancelRequest.objects.filter(task_id=task.id, status=CancelRequest.Status.PENDING)
    if not ended:
        requests.filter(scope=CancelScope.TASK).update(
            status=CancelRequest.Status.NO_EFFECT,
            resolution=f"the task left cancel_requested for {task.state} before the cancel completed",
            resolved_at=now,
        )
        return
    said, own = _end_answers(task, now), Q(scope=CancelScope.TASK)
    requests.update(
        status=Case(When(own, then=Value(said.own_status)), default=Value(said.other_status)),
        resolution=Case(When(own, then=Value(said.own_resolution)), default=Value(said.other_resolution)),
        resolved_at=now,
    )


def _stale_epoch(
    task: Task, epoch: int, region: str, owner_epoch: int, owner_region: str, **now_at: Any
) -> StaleEpoch:
    """The refusal of a write whose region lost the task: it names both owners, old and new."""
    return StaleEpoch(
        f"task {task.pk} failed over: it is owned by region {owner_region!r} at epoch {owner_epoch},"
        f" this write was for region {region!r} at epoch {epoch}",
        state=now_at.get("state", task.state),
        state_version=now_at.get("state_version", task.state_version),
    )


def task_start(
    task: Task,
    *,
    actor: Actor,
    progress: checkpoints.Progress,
    reason: str = "",
    reason_code: str = "",
    actions: Iterable[ActionIntent] = (),
    durable: bool = True,
) -> Task:
    """Insert ``task`` (unsaved, with tenant, type, objective, input…) at ``ready`` v1.

    Writes the creation event and the first checkpoint in the same transaction
    (``durable=False``: a savepoint inside the caller's, for a child task a
    parent's transition starts). Refuses with ``IntegrityError`` when the
    tenant already has a task with the same idempotency key (the caller then
    returns that task).
    """
    now = timezone.now()
    task.state, task.state_version, task.state_reason = State.READY, 1, ""
    task.created_at = task.updated_at = task.state_entered_at = now
    # The creation is a transition too (from nothing, by ``start``): its trace is the task's origin.
    with tracer.start_as_current_span("task.transition") as span:
        trace_id, traceparent = _trace_ids()
        rows = _ledger_rows(task, actions, now)
        checkpoint = _checkpoint_for(task, progress, rows, traceparent)
        event = _event_for(
            task,
            from_state="",
            trigger=Trigger.START,
            actor=actor,
            reason=reason,
            reason_code=reason_code,
            trace_id=trace_id,
            checkpoint=checkpoint,
        )
        task.audit_head = event.hash
        with transaction.atomic(durable=durable):
            task.save(force_insert=True)
            _write_history(event, checkpoint, rows)
        if span.is_recording():
            span.set_attributes(_transition_attributes(task, "", Trigger.START, actor))
    metrics.transitioned(Trigger.START, task.task_type, at=now)  # committed
    log.info(
        "task started", extra={"task_id": str(task.id), "task_type": task.task_type, "tenant": task.tenant_id}
    )
    return task


@dataclass(frozen=True)
class Append:
    """A write for ``advance(also=…)`` that only inserts one append-only row, whose id nobody reads
    (a model turn's usage), and what to run once it is committed (a counter).

    Run as any ``also`` write, it saves the row inside the transition's transaction; on PostgreSQL
    a transition whose ``also`` writes are all ``Append`` folds their rows into its one statement
    instead, inserted only if the compare-and-set moved the task.
    """

    row: models.Model
    committed: Callable[[], None] | None = None

    def __call__(self) -> None:
        self.row.save(force_insert=True)
        if self.committed is not None:
            transaction.on_commit(self.committed)


@dataclass(frozen=True)
class Advanced:
    """What ``advance_read`` committed: the task at its new version, and the checkpoint row it wrote."""

    task: Task
    checkpoint: Checkpoint | None
    released: bool = False  # the lease was given up in the same statement (``release=True``)


def advance_read(task: Task, to_state: State | str, **options: Any) -> Advanced:
    """``advance(task.id, task.state_version, to_state, ...)`` from a row the caller read itself.

    The task is not read again inside the transaction: the compare-and-set on
    ``state_version`` proves the row is still the one read, since every change
    to a task goes through a transition and bumps its version. For a worker
    holding the lease, which runs several steps in a row: it also gets back the
    checkpoint it wrote, so it resumes the next step without reading it back.
    ``task`` must be as read: it becomes the new version (and is useless after
    a refusal).

    ``release=True`` (with ``lease``): a worker that stops once this commits gives its lease up
    in the compare-and-set's own statement on PostgreSQL, not in one more round trip
    (``Advanced.released`` says whether it did; if not, the caller releases as usual).
    """
    return _advance(task.id, task.state_version, to_state, current=task, **options)


def advance(
    task_id: UUID | str,
    expected_version: int,
    to_state: State | str,
    *,
    actor: Actor,
    trigger: Trigger | str | None = None,
    reason: str = "",
    reason_code: str = "",
    progress: checkpoints.Progress | None = None,
    actions: Iterable[ActionIntent] = (),
    lease: Held | None = None,
    records: Iterable[models.Model] = (),
    also: Iterable[Callable[[], None]] = (),
    **changes: Any,
) -> Task:
    """Move a task from its current state to ``to_state`` at ``expected_version``.

    Sources: any state with an edge to ``to_state`` in the transition table
    that ``actor.kind`` may take (by ``trigger`` when given). On success the
    task is at ``expected_version + 1`` and, in the same commit, the audit
    log has one new event, ``progress`` (if given) became a checkpoint for the
    new version, and each of ``actions`` an intended ledger row.

    ``records`` are other rows that must commit with this transition or not at
    all (an input answer, an external event, an approval decision); ``also``
    are further writes run inside the same transaction (a guarded status
    change, a permission grant) — any of them raising aborts the whole.

    A worker passes the ``lease`` it holds: the write then also requires that
    lease to be live with the same fencing token.

    ``changes`` may set the fields in ``CHANGEABLE``. ``wait_deadline`` is
    kept on a self-loop, cleared when leaving a wait, and required when
    entering one.

    Refuses, changing nothing, with:
    - ``TaskNotFound`` — no such task;
    - ``StaleVersion`` — the task is no longer at ``expected_version`` (also
      when a concurrent writer commits first); reload and decide again;
    - ``TransitionNotAllowed`` — no edge from the current state to
      ``to_state`` for this actor (and trigger);
    - ``StaleEpoch`` — the task failed over to another region since ``lease``
      was claimed (or, without a lease, since the row was read);
    - ``LeaseLost`` — ``lease`` lapsed or another worker claimed the task since;
    - ``ValueError`` — an unknown field in ``changes`` (or ``region`` /
      ``ownership_epoch`` on any trigger but ``failover``), a wait without a deadline,
      a checkpoint larger than ``CHECKPOINT_MAX_BYTES`` (``checkpoint_too_large``),
      or ``actions`` without ``progress``: an intent's effect digest is bound to the
      audit chain through its checkpoint, and the dispatcher sends nothing unbound;
    - ``IntegrityError`` — an action whose idempotency key already exists, or
      a ``records`` row breaking a unique constraint (a duplicate delivery).
    """
    return _advance(
        task_id, expected_version, to_state, current=None, actor=actor, trigger=trigger, reason=reason,
        reason_code=reason_code, progress=progress, actions=actions, lease=lease, records=records,
        also=also, **changes,
    ).task  # fmt: skip


def _advance(
    task_id: UUID | str,
    expected_version: int,
    to_state: State | str,
    *,
    current: Task | None,
    actor: Actor,
    trigger: Trigger | str | None = None,
    reason: str = "",
    reason_code: str = "",
    progress: checkpoints.Progress | None = None,
    actions: Iterable[ActionIntent] = (),
    lease: Held | None = None,
    records: Iterable[models.Model] = (),
    also: Iterable[Callable[[], None]] = (),
    release: bool = False,
    **changes: Any,
) -> Advanced:
    unknown = set(changes) - CHANGEABLE
    if unknown:
        raise ValueError(f"advance() cannot change {sorted(unknown)}")
    actions = tuple(actions)
    if actions and progress is None:
        raise ValueError("an intent commits with a checkpoint: its pending_actions bind the effect digest")
    to_state = State(to_state)
    records, also = tuple(records), tuple(also)
    # Writes that only insert a row can ride on the one statement (``single``); any other runs after it.
    appends = tuple(write for write in also if isinstance(write, Append))
    if len(appends) < len(also):
        appends = ()
    # Attributes are set once committed, and only when the span is recorded: with no tracer
    # configured this costs next to nothing.
    with tracer.start_as_current_span("task.transition") as span:
        trace_id, traceparent = _trace_ids()
        # On PostgreSQL a commit with nothing of the caller's to run inside it is usually one
        # statement (``single`` below): then no transaction is opened around it (autocommit makes the
        # statement its own), and the task is read, if it must be, before any. The compare-and-set
        # proves the row unchanged since that read, as it does inside a transaction (READ COMMITTED).
        # A commit that turns out to need more opens its transaction after the read.
        bare = (
            hotpath.folds()
            and not records
            and len(appends) == len(also)
            and not transaction.get_connection().in_atomic_block
        )
        with ExitStack() as scope:
            if not bare:
                scope.enter_context(transaction.atomic(durable=True))
            task = current if current is not None else hotpath.load_task(task_id)
            if task is None:
                raise TaskNotFound(f"task {task_id} does not exist")
            # The ownership the write must still have: a worker's is its lease's, anyone else's the row's.
            epoch = lease.epoch if lease is not None else task.ownership_epoch
            region = lease.region if lease is not None and lease.region else task.region
            if epoch != task.ownership_epoch:
                raise _stale_epoch(task, epoch, region, task.ownership_epoch, task.region)
            if task.state_version != expected_version:
                raise StaleVersion(
                    f"task is at version {task.state_version}, not {expected_version}",
                    state=task.state,
                    state_version=task.state_version,
                )
            from_state, entered_before = task.state, task.state_entered_at
            edge = find_edge(from_state, to_state, trigger, actor.kind)
            if edge is None:
                by = f" by {trigger}" if trigger else ""
                raise TransitionNotAllowed(
                    f"{actor.kind} cannot move a task from {from_state} to {to_state}{by}",
                    state=from_state,
                    state_version=task.state_version,
                )
            if changes.keys() & OWNERSHIP and edge.trigger != Trigger.FAILOVER:
                raise ValueError(f"only a failover changes {sorted(changes.keys() & OWNERSHIP)}")

            now = timezone.now()
            for name, value in changes.items():
                setattr(task, name, value)
            if "wait_deadline" not in changes and to_state != from_state:
                task.wait_deadline = None
            if to_state in WAITING and task.wait_deadline is None:
                raise ValueError(f"entering {to_state} needs a wait_deadline")
            task.state, task.state_version, task.updated_at = to_state, expected_version + 1, now
            if edge.trigger != Trigger.FORK:  # an ended task forked keeps the reason it ended for
                task.state_reason = reason_code
            if to_state != from_state:
                task.state_entered_at = now
            rows = _ledger_rows(task, actions, now)
            # Built before the event, which records its digest (pure Python: no round trip).
            checkpoint = _checkpoint_for(task, progress, rows, traceparent) if progress is not None else None
            event = _event_for(
                task,
                from_state=from_state,
                trigger=edge.trigger,
                actor=actor,
                reason=reason,
                reason_code=reason_code,
                trace_id=trace_id,
                checkpoint=checkpoint,
            )
            task.audit_head = event.hash

            # The compare-and-set: the row count is the lock result. A writer that
            # committed first leaves 0 rows here (PostgreSQL re-checks the WHERE
            # after waiting on its row lock).
            # The fences (lease, ownership epoch) ride on the same UPDATE: no extra round trip, no gap
            # between check and write.
            fence = (lease.token, lease.worker_id) if lease is not None else None
            written = WRITTEN if changes.keys() & OWNERSHIP else ROUTINE_WRITTEN
            ended = to_state in TERMINAL and from_state not in TERMINAL
            left_cancel = from_state == State.CANCEL_REQUESTED and to_state != from_state
            folds = hotpath.folds()
            # An end answers the open cancel requests in its own statement, unless the caller's writes
            # (run after the compare-and-set) answer some of them themselves, or add one.
            close = (
                _end_answers(task, now)
                if ended and folds and not records and len(appends) == len(also)
                else None
            )
            released = release and fence is not None and folds
            anchor = audit_paths.anchor_request(task, edge.trigger, rows)
            # The whole commit as one statement: the history rows ride on the compare-and-set
            # (inserted only if it moved the row). Not when the caller's writes run after it, nor
            # when the commit locks a parent or answers a cancel request another way.
            single = (
                folds
                and not records
                and len(appends) == len(also)
                and not (ended and task.parent_id is not None)
                and (not left_cancel or ended)
            )
            history: list[models.Model] = []
            if single:
                history = [event, *([checkpoint] if checkpoint is not None else []), *rows]
                history += [anchor] if anchor is not None else []
                history += [append.row for append in appends]
            elif bare:
                scope.enter_context(transaction.atomic(durable=True))
            updated = hotpath.compare_and_set(
                task, expected_version=expected_version, from_state=from_state, fields=written, lease=fence,
                epoch=epoch, close=close, release=released, inserts=history,
            )  # fmt: skip
            if not updated:
                found = (
                    Task.objects.filter(pk=task.pk)
                    .values("state", "state_version", "ownership_epoch", "region")
                    .get()
                )
                now_at: dict[str, Any] = {"state": found["state"], "state_version": found["state_version"]}
                if found["ownership_epoch"] != epoch:  # first: the refusal says the region lost the task
                    owner = (found["ownership_epoch"], found["region"])
                    raise _stale_epoch(task, epoch, region, *owner, **now_at)
                if lease is not None and found["state_version"] == expected_version:
                    raise LeaseLost(f"lease #{lease.token} on task {task.pk} is no longer held", **now_at)
                raise StaleVersion(f"task moved on from version {expected_version}", **now_at)
            if single:
                for append in appends:  # their rows are in; what follows their commit waits for it
                    if append.committed is not None:
                        transaction.on_commit(append.committed)  # at once when bare: committed
            else:
                _write_history(event, checkpoint, rows, records)
                if anchor is not None:  # an anchor soon after a consequential commit
                    anchor.save(force_insert=True)
                for write in also:
                    write()
            if close is None and (ended or left_cancel):
                # After ``also``: a request the decision itself answered is answered as it says.
                _close_cancel_requests(task, now, ended=ended)
            if ended and task.parent_id is not None:  # the parent's record of how its child ended
                _child_ended_event(task).save(force_insert=True)
        if span.is_recording():
            span.set_attributes(_transition_attributes(task, from_state, edge.trigger, actor))
    log.info(
        "task advanced",
        extra={
            "task_id": str(task.id),
            "tenant": task.tenant_id,
            "from_state": from_state,
            "to_state": to_state,
            "state_version": task.state_version,
        },
    )
    metrics.transitioned(edge.trigger, task.task_type, left=entered_before, at=task.updated_at)  # committed
    if ended:  # committed: its parent may move on, its running children are canceled (tasks.hooks)
        hooks.after_task_ended.run(task)
    return Advanced(task, checkpoint, released)
