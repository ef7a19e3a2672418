"""Comparing the ledger with the world: settle actions whose outcome is in doubt.

For each ``unknown`` (or crash-interrupted ``dispatching``) action the
connector's authoritative ``lookup(key)`` decides: found succeeded ->
``reconciled_succeeded``; found failed -> ``reconciled_failed``; absent ->
``reconciled_absent`` (only now may the same key be sent again). A system
that cannot answer leaves the action in doubt; past
``UNKNOWN_OUTCOME_ESCALATE_AFTER`` the task is escalated to an operator.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from ledger import connectors
from ledger.connectors.base import OutcomeUnknown
from ledger.models import IN_DOUBT, Action, DispatchState
from ledger.services import action_move
from tasks import chaos
from tasks import services as task_services
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
BATCH = 200


def reconcile_action(action: Action) -> Action:
    """Ask the authoritative system about one in-doubt action and record the answer.

    A ``dispatching`` action younger than a send can take may still be on the
    wire: asking now could find it absent just before it lands, so it is left
    for a later round.
    """
    if action.dispatch_state not in IN_DOUBT:
        return action
    in_flight = timedelta(seconds=2 * settings.CONNECTOR_TIMEOUT + 1)
    if action.dispatch_state == DispatchState.DISPATCHING and timezone.now() - action.updated_at < in_flight:
        return action
    try:
        found = connectors.get(action.connector).lookup(action.idempotency_key)
    except OutcomeUnknown as exc:
        Action.objects.filter(pk=action.pk).update(last_error=str(exc)[:2000])
        return Action.objects.get(pk=action.pk)
    if found is None:
        target, fields = DispatchState.RECONCILED_ABSENT, {}
    else:
        target = (
            DispatchState.RECONCILED_SUCCEEDED
            if found.status == "succeeded"
            else DispatchState.RECONCILED_FAILED
        )
        fields = {
            "external_ref": found.external_ref,
            "outcome": {"status": found.status, "record_version": found.record_version, **found.detail},
        }
    action_move(action.pk, action.dispatch_state, target, **fields)
    return Action.objects.get(pk=action.pk)


@dataclass(frozen=True)
class Reconciled:
    task: Task
    settled: list[str]  # "key: dispatch_state" for each action looked at
    still_unknown: int

    @property
    def moved(self) -> bool:
        return self.task.state != State.OUTCOME_UNKNOWN


def reconcile_task(task_id: UUID | str, *, actor: Actor) -> Reconciled:
    """Settle a task's in-doubt actions; if none is left, move it on from ``outcome_unknown``.

    The task returns to ``ready`` at the step that dispatched (a new
    checkpoint, "after reconcile"), where the engine reads the settled action:
    done, failed, or absent and so safe to send again with the same key.
    Raises ``StaleVersion`` if the task moved meanwhile.
    """
    task = Task.objects.get(pk=task_id)
    looked = [reconcile_action(a) for a in Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT)]
    settled = [f"{a.idempotency_key}: {a.dispatch_state}" for a in looked]
    still_unknown = sum(a.dispatch_state in IN_DOUBT for a in looked)
    if task.state != State.OUTCOME_UNKNOWN:
        return Reconciled(task, settled, still_unknown)
    if still_unknown:
        _escalate_if_overdue(task, looked)
        return Reconciled(Task.objects.get(pk=task.pk), settled, still_unknown)
    point = task_services.task_resume_point(task.id, actor=actor)
    if point.quarantined:  # an unreadable checkpoint: nothing resumes from a guess
        return Reconciled(point.task, settled, 0)
    task = advance(
        task.id,
        task.state_version,
        State.READY,
        actor=actor,
        trigger=Trigger.RECONCILED,
        reason="; ".join(settled) or "nothing in doubt",
        reason_code="reconciled",
        progress=point.checkpoint.progress,
    )
    chaos.after_reconcile(task)
    task_services.ring_if_runnable(task)
    return Reconciled(task, settled, 0)


def _escalate_if_overdue(task: Task, looked: list[Action]) -> None:
    oldest = min((a.unknown_since or a.updated_at) for a in looked if a.dispatch_state in IN_DOUBT)
    overdue = timezone.now() - oldest > timedelta(seconds=settings.UNKNOWN_OUTCOME_ESCALATE_AFTER)
    if not overdue or task.escalation_level > 0:
        return
    try:
        advance(
            task.id,
            task.state_version,
            task.state,
            actor=Actor.system("reconciler"),
            trigger=Trigger.ESCALATE,
            reason=f"outcome unknown since {oldest:%Y-%m-%d %H:%M:%S} UTC",
            reason_code="unknown_outcome_overdue",
            escalation_level=1,
            escalated_to="operator",
            escalation_reason="The authoritative system has not confirmed an effect; check it by hand.",
        )
    except (StaleVersion, TransitionNotAllowed):
        pass


def reconcile_unknown(*, limit: int = BATCH) -> int:
    """The periodic reconciler: every task in ``outcome_unknown``, oldest first."""
    actor = Actor.system("reconciler")
    done = 0
    for task_id in (
        Task.objects.filter(state=State.OUTCOME_UNKNOWN)
        .order_by("state_entered_at")
        .values_list("id", flat=True)[:limit]
    ):
        try:
            done += reconcile_task(task_id, actor=actor).moved
        except StaleVersion:
            continue
        except DatabaseError:
            raise
        except Exception:  # one task's trouble must not stop the reconciler for all the others
            log.exception("reconciling a task failed", extra={"task_id": str(task_id)})
    return done
