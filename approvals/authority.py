"""Separation of duties: who may not decide an approval request, and why. The one rule, here only.

A request names everyone who caused its action to be asked for, and none of
them may decide it (approve or reject):

- whoever owns a task of its lineage (the requester: ``requested``);
- whoever started a task of its lineage, from that task's creation event:
  ``started`` it, ``reran`` it (a task with ``rerun_of``) or started it as a
  ``compensated`` run (a task with ``compensates``, ``tasks.compensation``);
- whoever ``escalated`` or ``released`` a task of its lineage (their audit events);
- whoever already decided an earlier request for the same action step on a task
  of its lineage (``approved_before``, ``rejected_before``): a rejection is
  overridden only by someone who neither reran the task nor decided it before.

The lineage (``lineage``) is the task and every task it runs again, through
``rerun_of``, nearest first (also where a rerun finds the effects it reuses,
``runtime.engine._reuse_earlier``). Everything is read from the tasks' own records
(owner, creation event, events, decisions), so a new way to start a task (an
A2A endpoint, an agent adapter) only has to record its starter as the creation
event's actor, as ``tasks.services.task_create(actor=...)`` does for every start.

The set is recorded on the request when it is raised (``ApprovalRequest.barred``,
written by ``approvals.services.request_decision``) and extended when an
escalation hands a pending request on (``approvals.services.Retarget``): an
escalation moves a request to another role, never to the escalator. The
decision (``refusal``, through ``approvals.services._may_decide``) and the inbox
(``not_barred``, in ``approvals.selectors.decidable``) both read that one set.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import Q
from pydantic import RootModel, ValidationError

from approvals.models import ApprovalDecision, ApprovalRequest, Decision
from audit.models import TransitionEvent
from tasks.models import Task
from tasks.states import ActorKind, Trigger

# Refusal codes (``approvals.services.ApprovalRefused.code``, the API's ``code``).
SELF_APPROVAL = "self_approval"  # the requester
DECIDED_BEFORE = "decided_before"  # decided an earlier request for the same action
CAUSED_THIS_REQUEST = "caused_this_request"  # started, reran, compensated, escalated or released it
UNREADABLE = "separation_unreadable"  # the recorded set is not of its schema: nobody may decide


class Cause(models.TextChoices):
    """Why someone may not decide a request; the label completes "you …" / "<actor> …"."""

    REQUESTED = "requested", "asked for this action"
    STARTED = "started", "started this task"
    RERAN = "reran", "reran this task"
    COMPENSATED = "compensated", "started this compensation run"
    ESCALATED = "escalated", "escalated it"
    RELEASED = "released", "released it from quarantine"
    APPROVED_BEFORE = "approved_before", "approved an earlier request for this action"
    REJECTED_BEFORE = "rejected_before", "rejected an earlier request for this action"


class Barred(RootModel[dict[str, list[Cause]]]):
    """The schema of ``ApprovalRequest.barred``: actor id (``user:<username>``) -> causes, in the
    order found. A JSON object keyed by actor, so "is this person barred" is one key lookup in SQL
    (``has_key``, on PostgreSQL and the SQLite demo alike)."""


# Actor kinds that are machinery, not people: a worker or a sweep causes nothing a person must not decide.
_MACHINES = frozenset({ActorKind.WORKER, ActorKind.SYSTEM})
_STARTED_BY = {Trigger.START: None, Trigger.ESCALATE: Cause.ESCALATED, Trigger.RELEASE: Cause.RELEASED}


def actor_id(user: Any) -> str:
    """A person's actor id, as ``tasks.transitions.Actor.user`` writes it in the audit log."""
    return f"user:{user.get_username()}"


def is_person(kind: str) -> bool:
    return kind not in _MACHINES


def lineage(task: Task) -> list[Task]:
    """``task`` and every task it runs again (``rerun_of``), nearest first; one query per generation."""
    found = [task]
    seen = {task.pk}
    while found[-1].rerun_of_id is not None and found[-1].rerun_of_id not in seen:
        earlier = Task.objects.select_related("owner").filter(pk=found[-1].rerun_of_id).first()
        if earlier is None:  # erased by retention: its records went with it
            break
        found.append(earlier)
        seen.add(earlier.pk)
    return found


def _start_cause(task: Task) -> Cause:
    if task.compensates_id is not None:
        return Cause.COMPENSATED
    return Cause.RERAN if task.rerun_of_id is not None else Cause.STARTED


def causes(task: Task, action_step: str) -> dict[str, list[str]]:
    """Who caused a request for ``action_step`` of ``task`` to be asked for, and why (``Barred``'s JSON).

    Two queries besides the lineage's: the people's events (creations, escalations, releases) and
    the earlier decisions for the same action step, over every task of the lineage.
    """
    tasks = lineage(task)
    barred: dict[str, list[str]] = {}

    def add(actor: str, cause: Cause) -> None:
        found = barred.setdefault(actor, [])
        if cause.value not in found:
            found.append(cause.value)

    for each in tasks:
        if each.owner is not None:
            add(actor_id(each.owner), Cause.REQUESTED)
    by_id = {each.pk: each for each in tasks}
    events = (
        TransitionEvent.objects.filter(task_id__in=by_id, trigger__in=list(_STARTED_BY))
        .exclude(actor_kind__in=list(_MACHINES))
        .order_by("created_at", "id")
        .values_list("task_id", "trigger", "actor_id")
    )
    for task_id, trigger, actor in events:
        add(actor, _STARTED_BY[Trigger(trigger)] or _start_cause(by_id[task_id]))
    decisions = (
        ApprovalDecision.objects.filter(request__task_id__in=by_id, request__action_step=action_step)
        .select_related("decided_by")
        .order_by("decided_at", "id")
    )
    for made in decisions:
        decided = Cause.APPROVED_BEFORE if made.decision == Decision.APPROVE else Cause.REJECTED_BEFORE
        add(actor_id(made.decided_by), decided)
    checked: dict[str, list[str]] = Barred.model_validate(barred).model_dump(mode="json")
    return checked


def _recorded(request: ApprovalRequest) -> Barred | None:
    """``request.barred`` read with its schema; None when it does not fit (altered outside the app)."""
    try:
        return Barred.model_validate(request.barred or {})
    except ValidationError:
        return None


def with_cause(request: ApprovalRequest, actor: str, cause: Cause) -> Any:
    """``request.barred`` with ``actor`` added for ``cause`` (what ``Retarget.apply`` writes); as it
    is for no actor ("": a sweep) or when it cannot be read (it then keeps refusing everyone)."""
    recorded = _recorded(request)
    if recorded is None or not actor:
        return request.barred
    barred: dict[str, list[str]] = recorded.model_dump(mode="json")
    if cause.value not in barred.setdefault(actor, []):
        barred[actor].append(cause.value)
    return barred


def barred(request: ApprovalRequest) -> dict[str, list[Cause]]:
    """Everyone ``request`` names as not deciding it, with why (its requester always among them:
    a request written before the column was kept holds only ``requested_by``; a task without an
    owner is its own requester, ``task:<id>``, which is nobody's actor id)."""
    recorded = (_recorded(request) or Barred({})).root
    found = {request.requested_by: [Cause.REQUESTED]} if request.requested_by.startswith("user:") else {}
    for actor, listed in recorded.items():
        found.setdefault(actor, [])
        found[actor] += [cause for cause in listed if cause not in found[actor]]
    return found


def why(causes: Iterable[Cause]) -> str:
    """The causes as one phrase: ``reran this task, escalated it``."""
    return ", ".join(Cause(cause).label for cause in causes)


def refusal(user: Any, request: ApprovalRequest) -> tuple[str, str] | None:
    """``(code, message)`` when ``user`` may not decide ``request`` for separation of duties, else None.

    ``self_approval`` for its requester, ``decided_before`` for an earlier decider, else
    ``caused_this_request``; the message names every cause that applies. Everyone is refused
    (``separation_unreadable``) when the recorded set does not fit its schema: who may decide
    cannot be told, so nobody does.
    """
    if _recorded(request) is None:
        return UNREADABLE, (
            "Who may not decide this request cannot be read (its record was altered), "
            "so nobody may decide it (separation of duties)."
        )
    found = barred(request).get(actor_id(user))
    if not found:
        return None
    if Cause.REQUESTED in found:
        code = SELF_APPROVAL
    elif {Cause.APPROVED_BEFORE, Cause.REJECTED_BEFORE} & set(found):
        code = DECIDED_BEFORE
    else:
        code = CAUSED_THIS_REQUEST
    reasons = ", you ".join(Cause(cause).label for cause in found)
    return code, f"You may not decide this request: you {reasons}. Someone else must (separation of duties)."


def not_barred(user: Any) -> Q:
    """``refusal(user, request) is None`` as a condition on requests (the inbox's)."""
    me = actor_id(user)
    return ~Q(requested_by=me) & ~Q(barred__has_key=me)
