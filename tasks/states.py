"""Task states and the ONE transition table.

Everything that needs to know which moves exist reads this module: the
transition primitive, the API's allowed-transitions field and its 409s, the
console's buttons, the docs. Nothing else lists edges.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import models


class State(models.TextChoices):
    READY = "ready"
    WAITING_INPUT = "waiting_input"
    WAITING_APPROVAL = "waiting_approval"
    WAITING_EXTERNAL = "waiting_external"
    WAITING_RETRY = "waiting_retry"
    WAITING_CHILDREN = "waiting_children"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCEL_REQUESTED = "cancel_requested"
    RESUME_VALIDATION = "resume_validation"
    QUARANTINED = "quarantined"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELED = "canceled"
    EXPIRED = "expired"


TERMINAL = frozenset({State.COMPLETED, State.FAILED, State.CANCELED, State.EXPIRED})
# Ended without completing: what a rerun may run again, and a compensation run may be tried again from.
ENDED_UNDONE = frozenset({State.FAILED, State.EXPIRED, State.CANCELED})
WAITING = frozenset(
    {
        State.WAITING_INPUT,
        State.WAITING_APPROVAL,
        State.WAITING_EXTERNAL,
        State.WAITING_RETRY,
        State.WAITING_CHILDREN,
    }
)
NON_TERMINAL = frozenset(State) - TERMINAL
# States a worker may hold a lease in and run steps from.
RUNNABLE = frozenset({State.READY, State.RESUME_VALIDATION, State.CANCEL_REQUESTED})


class ActorKind(models.TextChoices):
    """Who pulls a trigger. Tenant roles map onto these in ``kinds_for_roles``."""

    WORKER = "worker"  # a worker process holding the task's lease
    SYSTEM = "system"  # sweeps, creation, recovery tooling
    OPERATOR = "operator"  # a person with the operator role
    APPROVER = "approver"  # a person deciding an approval
    INTEGRATOR = "integrator"  # an API client feeding input and external events
    ADMIN = "admin"  # a tenant admin


class Trigger(models.TextChoices):
    START = "start"
    STEP = "step"  # a worker finished a step and stays runnable
    REQUEST_INPUT = "request_input"
    REQUEST_APPROVAL = "request_approval"
    AWAIT_EXTERNAL = "await_external"
    AWAIT_CHILDREN = "await_children"
    ATTEMPT_FAILED = "attempt_failed"
    STEP_TIMED_OUT = "step_timed_out"
    TURN_CANCELED = "turn_canceled"
    DISPATCH_UNKNOWN = "dispatch_unknown"
    COMPLETE = "complete"
    FAIL = "fail"
    INPUT_RECEIVED = "input_received"
    APPROVAL_DECIDED = "approval_decided"
    EXTERNAL_EVENT = "external_event"
    CHILDREN_DONE = "children_done"
    BACKOFF_ELAPSED = "backoff_elapsed"
    WAIT_EXPIRED = "wait_expired"
    DEADLINE_PASSED = "deadline_passed"
    RECONCILED = "reconciled"
    RECONCILED_FAILED = "reconciled_failed"
    RESEND_BACKOFF = "resend_backoff"
    LATE_EFFECT_FOUND = "late_effect_found"
    PROCEED = "proceed"
    REFRESH = "refresh"
    REPLAN = "replan"
    REAPPROVE = "reapprove"
    DEPLOYMENT_CHANGED = "deployment_changed"
    EXPIRE = "expire"
    CANCEL = "cancel"
    CANCEL_CONFIRMED = "cancel_confirmed"
    QUARANTINE = "quarantine"
    RELEASE = "release"
    RETRY = "retry"
    ESCALATE = "escalate"
    FAILOVER = "failover"
    # An operator resumed an ended task from one of its checkpoints as a new task (``tasks.forks``).
    FORK = "fork"


@dataclass(frozen=True)
class Edge:
    source: State
    target: State
    trigger: Trigger
    by: frozenset[ActorKind]
    # Kinds of ``by`` that may take the edge only on a task their own caller started (who started a
    # task: ``runtime.controls.started_by``). ``edges_from`` leaves them out unless told ``own=True``.
    own_only: frozenset[ActorKind] = frozenset()


S, T, A = State, Trigger, ActorKind


def _edges(
    sources: Iterable[State],
    target: State,
    trigger: Trigger,
    *by: ActorKind,
    own_only: Iterable[ActorKind] = (),
) -> list[Edge]:
    return [Edge(source, target, trigger, frozenset(by), frozenset(own_only)) for source in sorted(sources)]


TRANSITIONS: tuple[Edge, ...] = tuple(
    # A worker runs the task's steps from `ready`.
    _edges([S.READY], S.READY, T.STEP, A.WORKER)
    + _edges([S.READY], S.WAITING_INPUT, T.REQUEST_INPUT, A.WORKER)
    + _edges([S.READY], S.WAITING_APPROVAL, T.REQUEST_APPROVAL, A.WORKER)
    + _edges([S.READY], S.WAITING_EXTERNAL, T.AWAIT_EXTERNAL, A.WORKER)
    + _edges([S.READY, S.RESUME_VALIDATION], S.WAITING_RETRY, T.ATTEMPT_FAILED, A.WORKER)
    # Kept apart from a failure: a step that ran out of time, a model turn an operator canceled.
    + _edges([S.READY], S.WAITING_RETRY, T.STEP_TIMED_OUT, A.WORKER)
    + _edges([S.READY], S.WAITING_RETRY, T.TURN_CANCELED, A.WORKER)
    # A step started child tasks; the parent waits until every child has ended.
    + _edges([S.READY], S.WAITING_CHILDREN, T.AWAIT_CHILDREN, A.WORKER)
    + _edges([S.READY, S.CANCEL_REQUESTED], S.OUTCOME_UNKNOWN, T.DISPATCH_UNKNOWN, A.WORKER)
    + _edges([S.READY], S.COMPLETED, T.COMPLETE, A.WORKER)
    + _edges([S.READY, S.RESUME_VALIDATION], S.FAILED, T.FAIL, A.WORKER)
    # A checkpoint written by another deployment is revalidated before a worker resumes from it.
    + _edges([S.READY], S.RESUME_VALIDATION, T.DEPLOYMENT_CHANGED, A.WORKER)
    # Leaving any wait goes through resume validation first.
    + _edges([S.WAITING_INPUT], S.RESUME_VALIDATION, T.INPUT_RECEIVED, A.INTEGRATOR, A.OPERATOR)
    + _edges([S.WAITING_APPROVAL], S.RESUME_VALIDATION, T.APPROVAL_DECIDED, A.APPROVER)
    + _edges([S.WAITING_EXTERNAL], S.RESUME_VALIDATION, T.EXTERNAL_EVENT, A.INTEGRATOR, A.SYSTEM)
    + _edges([S.WAITING_RETRY], S.RESUME_VALIDATION, T.BACKOFF_ELAPSED, A.SYSTEM)
    + _edges([S.WAITING_CHILDREN], S.RESUME_VALIDATION, T.CHILDREN_DONE, A.SYSTEM)
    + _edges([S.WAITING_RETRY], S.RESUME_VALIDATION, T.RETRY, A.OPERATOR, A.ADMIN)
    # A wait past its wait_deadline either revalidates (the task type may re-request)
    # or expires; a task past its own deadline expires.
    + _edges(WAITING, S.RESUME_VALIDATION, T.WAIT_EXPIRED, A.SYSTEM)
    + _edges(WAITING, S.EXPIRED, T.WAIT_EXPIRED, A.SYSTEM)
    + _edges(WAITING | {S.READY, S.RESUME_VALIDATION}, S.EXPIRED, T.DEADLINE_PASSED, A.SYSTEM, A.WORKER)
    # Resume validation decides how to go on; each outcome is its own trigger.
    + _edges([S.RESUME_VALIDATION], S.READY, T.PROCEED, A.WORKER)
    + _edges([S.RESUME_VALIDATION], S.READY, T.REFRESH, A.WORKER)
    + _edges([S.RESUME_VALIDATION], S.READY, T.REPLAN, A.WORKER)
    + _edges([S.RESUME_VALIDATION], S.WAITING_APPROVAL, T.REAPPROVE, A.WORKER)
    + _edges([S.RESUME_VALIDATION], S.EXPIRED, T.EXPIRE, A.WORKER)
    # An effect whose outcome is unknown is settled by reconciliation only.
    + _edges([S.OUTCOME_UNKNOWN], S.READY, T.RECONCILED, A.WORKER, A.SYSTEM, A.OPERATOR, A.ADMIN)
    + _edges(
        [S.OUTCOME_UNKNOWN], S.WAITING_RETRY, T.RECONCILED_FAILED, A.WORKER, A.SYSTEM, A.OPERATOR, A.ADMIN
    )
    # Found absent: sent again with the same key, but only after a backoff.
    + _edges([S.OUTCOME_UNKNOWN], S.WAITING_RETRY, T.RESEND_BACKOFF, A.WORKER, A.SYSTEM, A.OPERATOR, A.ADMIN)
    # Cancellation is a request; a worker confirms it after reconciling in-flight effects.
    # An operator control. An integrating system starts and feeds tasks and stops none but those it
    # started itself (an A2A caller's CancelTask); the system pulls it for the children of a parent
    # whose cancel covers them.
    + _edges(
        NON_TERMINAL - {S.CANCEL_REQUESTED},
        S.CANCEL_REQUESTED,
        T.CANCEL,
        A.OPERATOR,
        A.ADMIN,
        A.SYSTEM,
        A.INTEGRATOR,
        own_only=[A.INTEGRATOR],
    )
    + _edges([S.CANCEL_REQUESTED], S.CANCELED, T.CANCEL_CONFIRMED, A.WORKER, A.SYSTEM)
    # Quarantine holds a task nothing can safely resume; release sends it back
    # through validation (after its checkpoint was migrated or repaired).
    + _edges(
        NON_TERMINAL - {S.QUARANTINED}, S.QUARANTINED, T.QUARANTINE, A.WORKER, A.SYSTEM, A.OPERATOR, A.ADMIN
    )
    + _edges([S.QUARANTINED], S.RESUME_VALIDATION, T.RELEASE, A.OPERATOR, A.ADMIN)
    # An older deployment's quarantine over a key it computed in another scheme, the facts unchanged:
    # lifted by this one's sweep (runtime.rollout), nothing else.
    + _edges([S.QUARANTINED], S.RESUME_VALIDATION, T.DEPLOYMENT_CHANGED, A.SYSTEM)
    # An ended task never leaves its terminal state, but an effect found absent
    # that landed late after all amends its report: an audited self-loop.
    + [Edge(s, s, T.LATE_EFFECT_FOUND, frozenset({A.SYSTEM})) for s in sorted(TERMINAL)]
    # A fork (``tasks.forks``) starts a new task from one of an ended task's checkpoints; the ended one
    # records it in its own history with this audited self-loop, and otherwise stays as it ended.
    + [Edge(s, s, T.FORK, frozenset({A.OPERATOR, A.ADMIN})) for s in sorted(TERMINAL)]
    # Escalation is orthogonal to state: a self-loop that bumps the version.
    + [Edge(s, s, T.ESCALATE, frozenset({A.OPERATOR, A.ADMIN, A.SYSTEM})) for s in sorted(NON_TERMINAL)]
    # So is ownership: failover moves a task to another region and bumps its epoch (manage.py failover).
    + [Edge(s, s, T.FAILOVER, frozenset({A.SYSTEM})) for s in sorted(NON_TERMINAL)]
)

_BY_SOURCE: dict[State, tuple[Edge, ...]] = {
    state: tuple(edge for edge in TRANSITIONS if edge.source == state) for state in State
}


def edges_from(
    source: State | str, *, kinds: Iterable[ActorKind] | None = None, own: bool = False
) -> tuple[Edge, ...]:
    """Edges leaving ``source`` (optionally only those some kind in ``kinds`` may pull; a kind the edge
    allows only on its own tasks counts when ``own``: the caller started this task)."""
    edges = _BY_SOURCE[State(source)]
    if kinds is None:
        return edges
    allowed = frozenset(kinds)
    return tuple(edge for edge in edges if pullers(edge, allowed, own=own))


def pullers(edge: Edge, kinds: Iterable[ActorKind], *, own: bool = False) -> frozenset[ActorKind]:
    """Which of ``kinds`` may pull ``edge`` (``own``: on a task the caller started)."""
    may = edge.by & frozenset(kinds)
    return may if own else may - edge.own_only


def find_edge(
    source: State | str, target: State | str, trigger: Trigger | str | None, kind: ActorKind
) -> Edge | None:
    """The edge ``kind`` may take from ``source`` to ``target`` (by ``trigger`` if given)."""
    for edge in _BY_SOURCE[State(source)]:
        if edge.target == target and kind in edge.by and (trigger is None or edge.trigger == trigger):
            return edge
    return None


def allowed_pairs() -> frozenset[tuple[State, State]]:
    return frozenset((edge.source, edge.target) for edge in TRANSITIONS)


ROLE_KINDS: dict[str, frozenset[ActorKind]] = {
    "operator": frozenset({A.OPERATOR, A.INTEGRATOR}),
    "approver": frozenset({A.APPROVER}),
    "auditor": frozenset(),
    "admin": frozenset({A.ADMIN, A.OPERATOR, A.INTEGRATOR}),
    "integrator": frozenset({A.INTEGRATOR}),
}


def kinds_for_roles(roles: Iterable[str]) -> frozenset[ActorKind]:
    kinds: frozenset[ActorKind] = frozenset()
    for role in roles:
        kinds |= ROLE_KINDS.get(role, frozenset())
    return kinds
