"""Comparing the ledger with the world: settle actions whose outcome is in doubt.

For each ``unknown`` (or crash-interrupted ``dispatching``) action the
connector's authoritative ``lookup(key)`` decides:

- found succeeded -> ``reconciled_succeeded``; found failed -> ``reconciled_failed``;
- not found -> ``reconciled_absent``, but only when the lookup was made after
  the send could no longer land (``CONNECTOR_MAX_IN_FLIGHT`` after its claim).
  Earlier, "not found" only means "not yet": the action stays in doubt. Only an
  absent action may be sent again, with the same key, and only after a backoff
  (the task waits in ``waiting_retry``); after ``LEDGER_MAX_SENDS`` sends the
  task is quarantined and escalated instead of sending again.
- a system that cannot answer leaves the action in doubt; past
  ``UNKNOWN_OUTCOME_ESCALATE_AFTER`` the task is escalated to an operator.

Effects found absent for tasks that have ended are asked about again for a
while (``LATE_EFFECT_WINDOW``): one that landed after all is recorded and the
task's report amended by an audited transition.
"""

from __future__ import annotations

import functools
import logging
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone
from opentelemetry import trace

from audit.redaction import redact
from ledger import connectors
from ledger.connectors.base import Outcome, OutcomeUnknown
from ledger.models import IN_DOUBT, Action, DispatchState
from ledger.services import action_move
from runtime import chaos
from runtime.dispatch import action_attributes
from tasks import metrics
from tasks import services as task_services
from tasks.backoff import capped_backoff
from tasks.checkpoints import Progress
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.states import TERMINAL, State, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
BATCH = 200
RECONCILER = Actor.system("reconciler")
tracer = trace.get_tracer(__name__)


def _seconds(name: str) -> timedelta:
    return timedelta(seconds=getattr(settings, name))


def _found(found: Outcome) -> tuple[DispatchState, dict[str, Any]]:
    target = (
        DispatchState.RECONCILED_SUCCEEDED if found.status == "succeeded" else DispatchState.RECONCILED_FAILED
    )
    fields = {
        "external_ref": found.external_ref,
        "outcome": {"status": found.status, "record_version": found.record_version, **found.detail},
    }
    return target, fields


def lands_by(action: Action) -> datetime:
    """The moment after which the action's latest send can no longer land."""
    sent = action.dispatched_at or action.unknown_since or action.updated_at
    return sent + _seconds("CONNECTOR_MAX_IN_FLIGHT")


def reconcile_action(action: Action, *, force: bool = False) -> Action:
    """Ask the authoritative system about one in-doubt action and record what is known.

    Asks at most every ``LEDGER_LOOKUP_INTERVAL`` per action unless ``force``.
    Every write is guarded by the send count seen, so an answer about one send
    never settles the next.
    """
    if action.dispatch_state not in IN_DOUBT:
        return action
    asked_at = timezone.now()
    if not force and action.checked_at and asked_at - action.checked_at < _seconds("LEDGER_LOOKUP_INTERVAL"):
        return action
    # One span per lookup made: its result is the state the action was settled in, or still in doubt.
    with tracer.start_as_current_span("action.reconcile") as span:
        looked = _look_up(action, asked_at)
        if span.is_recording():
            result = "in_doubt" if looked.dispatch_state in IN_DOUBT else str(looked.dispatch_state)
            span.set_attributes({**action_attributes(looked), "durable.reconcile.result": result})
        return looked


def _look_up(action: Action, asked_at: datetime) -> Action:
    """Ask the action's system about it and record the answer (``reconcile_action``)."""
    guard = {"pk": action.pk, "dispatch_state": action.dispatch_state, "attempts": action.attempts}
    try:
        found = connectors.get(action.connector).lookup(action.idempotency_key)
    except OutcomeUnknown as exc:
        Action.objects.filter(**guard).update(last_error=redact(str(exc))[:2000], checked_at=asked_at)
        metrics.reconciled("no_answer")
        return Action.objects.get(pk=action.pk)
    target: DispatchState
    fields: dict[str, Any]
    if found is None:
        landing = lands_by(action)
        if asked_at < landing:
            note = f"not found yet; trusted as absent from {landing:%Y-%m-%d %H:%M:%S} UTC"
            Action.objects.filter(**guard).update(last_error=note, checked_at=asked_at)
            metrics.reconciled("not_yet")
            return Action.objects.get(pk=action.pk)
        target, fields = DispatchState.RECONCILED_ABSENT, {}
    else:
        target, fields = _found(found)
    if action_move(
        action.pk, action.dispatch_state, target, attempts=action.attempts, checked_at=asked_at, **fields
    ):
        metrics.reconciled(target, unknown_since=action.unknown_since or action.dispatched_at, at=asked_at)
    return Action.objects.get(pk=action.pk)


@dataclass(frozen=True)
class Reconciled:
    task: Task
    settled: list[str]  # "key: dispatch_state" for each action looked at
    still_unknown: int

    @property
    def moved(self) -> bool:
        return self.task.state != State.OUTCOME_UNKNOWN


def resend_backoff(sends: int, *, rng: random.Random | None = None) -> timedelta:
    """How long to wait before send number ``sends + 1``: doubling, capped, with jitter.

    The jitter (between half and all of the delay) keeps many tasks that failed
    together from resending together.
    """
    delay = capped_backoff(settings.LEDGER_RESEND_BACKOFF, sends - 1, settings.LEDGER_RESEND_BACKOFF_MAX)
    return timedelta(seconds=delay * (rng or random).uniform(0.5, 1.0))


def reconcile_task(task_id: UUID | str, *, actor: Actor, force: bool = False) -> Reconciled:
    """Settle a task's in-doubt actions; if none is left, move it on from ``outcome_unknown``.

    - every effect settled as done or failed: back to ``ready`` at the step that
      dispatched (a new checkpoint, "after reconcile"), where the engine reads it;
    - an effect absent: ``waiting_retry`` until its backoff ends, then sent
      again with the same key; after ``LEDGER_MAX_SENDS`` sends, ``quarantined``
      and escalated to an operator instead.
    Raises ``StaleVersion`` if the task moved meanwhile.
    """
    task = Task.objects.get(pk=task_id)
    looked = [
        reconcile_action(a, force=force)
        for a in Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT)
    ]
    settled = [f"{a.idempotency_key}: {a.dispatch_state}" for a in looked]
    still_unknown = sum(a.dispatch_state in IN_DOUBT for a in looked)
    if task.state == State.CANCEL_REQUESTED and still_unknown:
        # A cancel waits for its in-doubt effects like a dispatch does: escalate it the same way.
        _escalate_if_overdue(task, looked)
    if task.state != State.OUTCOME_UNKNOWN:
        return Reconciled(Task.objects.get(pk=task.pk), settled, still_unknown)
    if still_unknown:
        _escalate_if_overdue(task, looked)
        return Reconciled(Task.objects.get(pk=task.pk), settled, still_unknown)
    point = task_services.task_resume_point(task.id, actor=actor)
    if point.checkpoint is None:  # quarantined: an unreadable checkpoint; nothing resumes from a guess
        return Reconciled(point.task, settled, 0)
    absent = list(Action.objects.filter(task=task, dispatch_state=DispatchState.RECONCILED_ABSENT))
    progress = point.checkpoint.progress
    if absent:
        task = _schedule_resend(task, absent, settled, actor=actor, progress=progress)
    else:
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            trigger=Trigger.RECONCILED,
            reason="; ".join(settled) or "nothing in doubt",
            reason_code="reconciled",
            actor=actor,
            progress=progress,
        )
    chaos.after_reconcile(task)
    task_services.ring_if_runnable(task)
    return Reconciled(task, settled, 0)


def _schedule_resend(
    task: Task, absent: list[Action], settled: list[str], *, actor: Actor, progress: Progress
) -> Task:
    sends = max(a.attempts for a in absent)
    keys = ", ".join(a.idempotency_key for a in absent)
    if sends >= settings.LEDGER_MAX_SENDS:
        why = f"{keys} not performed after {sends} sends; check the system before releasing"
        return advance(
            task.id,
            task.state_version,
            State.QUARANTINED,
            trigger=Trigger.QUARANTINE,
            reason=why,
            reason_code="resend_limit_reached",
            escalation_level=max(task.escalation_level, 1),
            escalated_to=task.escalated_to or "operator",
            escalation_reason=why,
            actor=actor,
            progress=progress,
        )
    wait = resend_backoff(sends)
    return advance(
        task.id,
        task.state_version,
        State.WAITING_RETRY,
        trigger=Trigger.RESEND_BACKOFF,
        reason=f"{'; '.join(settled) or keys}; send {sends + 1} in {wait.total_seconds():.1f}s",
        reason_code="effect_absent",
        wait_deadline=timezone.now() + wait,
        actor=actor,
        progress=progress,
    )


def _escalate_if_overdue(task: Task, looked: list[Action]) -> None:
    oldest = min((a.unknown_since or a.updated_at) for a in looked if a.dispatch_state in IN_DOUBT)
    overdue = timezone.now() - oldest > _seconds("UNKNOWN_OUTCOME_ESCALATE_AFTER")
    if not overdue or task.escalation_level > 0:
        return
    try:
        advance(
            task.id,
            task.state_version,
            task.state,
            actor=RECONCILER,
            trigger=Trigger.ESCALATE,
            reason=f"outcome unknown since {oldest:%Y-%m-%d %H:%M:%S} UTC",
            reason_code="unknown_outcome_overdue",
            escalation_level=1,
            escalated_to="operator",
            escalation_reason="The authoritative system has not confirmed an effect; check it by hand.",
        )
    except (StaleVersion, TransitionNotAllowed):
        pass


def _settle_late(action: Action, target: str, fields: dict[str, Any], checked_at: datetime) -> None:
    """Inside the amending transition: the action moves with the report, or neither does."""
    if not action_move(
        action.pk,
        DispatchState.RECONCILED_ABSENT,
        target,
        attempts=action.attempts,
        checked_at=checked_at,
        **fields,
    ):
        raise StaleVersion(f"{action.idempotency_key} moved while its late landing was being recorded")


def _amend_report(action: Action, target: str, fields: dict[str, Any], checked_at: datetime) -> None:
    """Record an effect that landed after its task ended, and list it in the task's report."""
    task = Task.objects.get(pk=action.task_id)
    found = {
        "action": action.idempotency_key,
        "connector": action.connector,
        "external_ref": fields["external_ref"],
        "step": action.step,
    }
    outcome = dict(task.outcome or {})
    outcome["late_effects"] = [
        *outcome.get("late_effects", []),
        {**found, "found_at": checked_at.isoformat()},
    ]
    if "effects_not_undone" in outcome:  # a cancel's report: the effect stays done
        outcome["effects_not_undone"] = [*outcome["effects_not_undone"], found]
    advance(
        task.id,
        task.state_version,
        task.state,
        actor=RECONCILER,
        trigger=Trigger.LATE_EFFECT_FOUND,
        reason=(
            f"{action.connector} performed {action.idempotency_key} after it was found absent "
            f"and the task ended ({task.state}); the report now lists it"
        ),
        reason_code="late_effect_found",
        outcome=outcome,
        also=(functools.partial(_settle_late, action, target, fields, checked_at),),
    )


def recheck_absent(*, limit: int = BATCH, region: str | None = None) -> int:
    """Ask again about effects found absent for ``region``'s tasks that have ended; return how many
    landed late."""
    now = timezone.now()
    due = (
        Action.objects.filter(
            dispatch_state=DispatchState.RECONCILED_ABSENT,
            resolved_at__gte=now - _seconds("LATE_EFFECT_WINDOW"),
            task__state__in=TERMINAL,
            task__region=region or settings.WORKER_REGION,
        )
        .filter(Q(checked_at__isnull=True) | Q(checked_at__lte=now - _seconds("LATE_EFFECT_RECHECK_EVERY")))
        .order_by("resolved_at")[:limit]
    )
    landed = 0
    for action in due:
        guard = {"pk": action.pk, "dispatch_state": action.dispatch_state, "attempts": action.attempts}
        checked_at = timezone.now()
        try:
            found = connectors.get(action.connector).lookup(action.idempotency_key)
        except OutcomeUnknown:
            found = None
        if found is None:
            Action.objects.filter(**guard).update(checked_at=checked_at)
            continue
        target, fields = _found(found)
        if target != DispatchState.RECONCILED_SUCCEEDED:  # recorded as failed: nothing was performed
            action_move(action.pk, action.dispatch_state, target, attempts=action.attempts, **fields)
            continue
        try:
            _amend_report(action, target, fields, checked_at)
            landed += 1
        except StaleVersion:
            continue  # the task or the action moved; the next round looks again
    return landed


def reconcile_unknown(*, limit: int = BATCH, region: str | None = None) -> int:
    """The periodic reconciler of ``region`` (default ``WORKER_REGION``): every task of its own in
    ``outcome_unknown`` (and every cancel waiting on an effect in doubt), oldest first; then late
    landings. Like the sweep, it never moves a task another region owns (``runtime.failover``)."""
    region = region or settings.WORKER_REGION
    done = 0
    in_doubt = Exists(Action.objects.filter(task=OuterRef("pk"), dispatch_state__in=IN_DOUBT))
    waiting_on_effects = Q(state=State.OUTCOME_UNKNOWN) | (Q(state=State.CANCEL_REQUESTED) & in_doubt)
    for task_id in (
        Task.objects.filter(waiting_on_effects, region=region)
        .order_by("state_entered_at")
        .values_list("id", flat=True)[:limit]
    ):
        try:
            done += reconcile_task(task_id, actor=RECONCILER).moved
        except StaleVersion:
            continue
        except DatabaseError:
            raise
        except Exception:  # one task's trouble must not stop the reconciler for all the others
            log.exception("reconciling a task failed", extra={"task_id": str(task_id)})
    try:
        recheck_absent(limit=limit, region=region)
    except DatabaseError:
        raise
    except Exception:
        log.exception("rechecking absent effects failed")
    return done
