"""Operator controls: retry, cancel, reconcile, quarantine, release, retry migration, escalate.

Each is one transition at the expected version, pulled by a person whose
tenant roles allow that edge of the transition table (``tasks.states``), with
a reason; ``reconcile`` asks the authoritative systems first
(``runtime.reconcile``). Views and API endpoints call ``task_control`` only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from approvals import services as approvals
from runtime.reconcile import reconcile_task
from tasks import cancellation, services
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import CancelScope, Task
from tasks.states import ActorKind, State, Trigger, edges_from, kinds_for_roles, pullers
from tasks.transitions import Actor, advance

# Operator controls, by name, and the trigger each pulls. Targets come from the
# transition table (the one edge with that trigger leaving the current state).
CONTROLS: dict[str, Trigger] = {
    "cancel": Trigger.CANCEL,
    "quarantine": Trigger.QUARANTINE,
    "release": Trigger.RELEASE,
    # A release that first reads the stored checkpoint with this deployment's code, and
    # refuses (CheckpointUnreadable, nothing written) while it still cannot be read.
    "retry_migration": Trigger.RELEASE,
    "retry": Trigger.RETRY,
    "escalate": Trigger.ESCALATE,
    "reconcile": Trigger.RECONCILED,
}
# Controls whose result is visible in the state alone: repeating one is a no-op.
_SETTLED_BY_STATE = {"cancel": State.CANCEL_REQUESTED, "quarantine": State.QUARANTINED}
CANCEL_SCOPES = tuple(CancelScope.values)
# When a person's roles give several kinds that may pull an edge, the audit event names the first of
# these: an operator's cancel is the operator's, whatever else their roles allow (an operator's and an
# admin's roles also give the integrator kind, which may cancel the tasks its caller started).
PRECEDENCE: tuple[ActorKind, ...] = (
    ActorKind.ADMIN,
    ActorKind.OPERATOR,
    ActorKind.APPROVER,
    ActorKind.INTEGRATOR,
    ActorKind.SYSTEM,
    ActorKind.WORKER,
)
ESCALATION_ROLES = ("operator", "approver", "admin")


def migration_may_help(reason_code: str) -> bool:
    """Whether ``retry_migration`` is worth offering: the task was held over its checkpoint (one that did
    not read, or read wrong). For any other reason its checkpoint reads, and there is nothing to migrate."""
    return reason_code.startswith("checkpoint_")


def started_by(task: Task, user: Any) -> bool:
    """Whether ``user`` started ``task`` (its ``owner``: the token's user that started it over A2A or
    the REST API, kept by a rerun). The one ownership rule of the controls: an edge's ``own_only``
    kinds (an integrator's cancel) apply only when this holds."""
    return task.owner_id is not None and task.owner_id == getattr(user, "pk", None)


def acting_kind(kinds: frozenset[ActorKind]) -> ActorKind:
    """The kind the audit event records, of those that may pull the edge (``PRECEDENCE``)."""
    return next(kind for kind in PRECEDENCE if kind in kinds)


def label(control: str) -> str:
    """How people read a control's name: ``retry_migration`` -> ``retry migration``."""
    return control.replace("_", " ")


@dataclass(frozen=True)
class ControlResult:
    task: Task
    applied: bool
    note: str = ""


def task_control(
    task: Task,
    control: str,
    *,
    user: Any,
    roles: frozenset[str],
    expected_version: int,
    reason: str,
    scope: str = "task",
    escalate_to: str = "admin",
) -> ControlResult:
    """Apply an operator control at ``expected_version`` as ``user`` holding ``roles``.

    A control whose outcome already holds (cancel on a task already
    ``cancel_requested``, quarantine on a quarantined one) applies nothing and
    reports ``applied=False``. Otherwise refuses like ``advance``:
    ``StaleVersion`` or ``TransitionNotAllowed`` (no such edge from the
    current state for this actor). ``retry_migration`` also raises
    ``CheckpointUnreadable`` while the newest checkpoint still cannot be read.
    """
    trigger = CONTROLS[control]
    settled = _SETTLED_BY_STATE.get(control)
    if settled is not None and task.state == settled:
        return ControlResult(task, applied=False)
    if task.state_version != expected_version:
        raise StaleVersion(
            f"task is at version {task.state_version}, not {expected_version}",
            state=task.state,
            state_version=task.state_version,
        )
    kinds = kinds_for_roles(roles)
    own = started_by(task, user)
    edge = next((e for e in edges_from(task.state, kinds=kinds, own=own) if e.trigger == trigger), None)
    if edge is None:
        raise TransitionNotAllowed(
            f"{control} is not possible from {task.state} with roles {sorted(roles)}",
            state=task.state,
            state_version=task.state_version,
        )
    actor = Actor.user(user, acting_kind(pullers(edge, kinds, own=own)))
    if control == "cancel" and scope != CancelScope.TASK:
        if scope not in CANCEL_SCOPES:
            raise ValueError(f"unknown cancel scope {scope!r}")
        request, created = cancellation.request_scoped(task, scope, actor=actor, reason=reason)
        note = request.resolution or f"{label(scope)} cancel recorded; the worker applies it at its next step"
        return ControlResult(Task.objects.get(pk=task.pk), applied=created, note=note)
    records: list[Any] = []
    if control == "reconcile":
        result = reconcile_task(task.id, actor=actor, force=True)  # asked by a person: ask the system now
        note = "; ".join(result.settled) or "nothing was in doubt"
        if result.still_unknown:
            note = f"{result.still_unknown} still unknown: {note}"
        return ControlResult(result.task, applied=result.moved, note=note)
    changes: dict[str, Any] = {}
    also: list[Callable[[], None]] = []
    reason_code = control
    if control == "escalate":
        changes = {
            "escalation_level": task.escalation_level + 1,
            "escalated_to": escalate_to,
            "escalation_reason": reason,
        }
        # A task waiting for approval keeps its request, now decided by the escalation's role
        # but never by the escalator, at the version the escalation moves the task to
        # (recorded in the event's reason).
        retarget = approvals.retarget_on_escalation(task, escalate_to=escalate_to, by=actor)
        if retarget is not None:
            also.append(functools.partial(retarget.apply, expected_version + 1))
            reason = f"{reason} ({retarget.note})"
    elif control == "cancel":
        reason_code = f"cancel:{scope}"
        records.append(
            cancellation.request_record(task, scope, actor=actor, reason=reason, at_version=expected_version)
        )
    elif control == "retry_migration":
        read = services.latest_checkpoint(task)  # raises while this code still cannot read it
        reason = f"{reason} (checkpoint now reads: step {read.step}, schema {read.schema_version})"
    task = advance(
        task.id,
        expected_version,
        edge.target,
        actor=actor,
        trigger=trigger,
        reason=reason,
        reason_code=reason_code,
        records=records,
        also=also,
        **changes,
    )
    services.ring_if_runnable(task)
    if control == "cancel":  # the children stop now, not when a worker gets to the parent
        cancellation.cancel_children(task, reason=f"parent task {task.id} canceled: {reason}")
    return ControlResult(task, applied=True)
