"""Cancel requests by scope, and a task's children under a parent's cancel.

- ``task``: a transition to ``cancel_requested``, committed with its request row.
  A worker then stops at its next step boundary (or interrupts the model turn in
  flight), cancels the children and waits for them to end, settles every effect
  in doubt with the authoritative system, and confirms ``canceled`` with a report.
- ``children``: every child still running is asked to cancel (scope ``task``),
  at once; the parent keeps waiting and goes on with what its children ended with.
- ``model_turn`` / ``tool_call``: recorded, no state change. The worker applies
  it: a turn in flight is interrupted (a model that supports it stops at once;
  any other's answer is thrown away) and retried after a backoff, not counted as a
  failed attempt; a side effect not yet sent is withdrawn, one already sent
  cannot be and is reconciled as usual.

Every request is a ``CancelRequest`` row saying who asked, at which version,
and what came of it (``applied`` or ``no_effect``, with a note).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from uuid import UUID

from django.db import IntegrityError, transaction
from django.db.models import Exists
from django.utils import timezone

from tasks import children, doorbell, registry
from tasks.exceptions import StaleVersion, TransitionError
from tasks.models import CancelRequest, CancelScope, Task
from tasks.states import TERMINAL, State, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
PROPAGATOR = Actor.system("parent-cancel")


def request_record(task: Task, scope: str, *, actor: Actor, reason: str, at_version: int) -> CancelRequest:
    """An unsaved request row (a ``task`` request commits it with its transition, which is why at
    most one is ever open: a task leaving ``cancel_requested`` closes its own, ``tasks.transitions``)."""
    return CancelRequest(
        task=task,
        scope=scope,
        requested_by=actor.id,
        reason=reason,
        requested_version=at_version,
        requested_at=timezone.now(),
    )


def request_scoped(task: Task, scope: str, *, actor: Actor, reason: str) -> tuple[CancelRequest, bool]:
    """Record a ``model_turn``, ``tool_call`` or ``children`` request; ``(request, created)``.

    An open request of the same scope is the answer to asking again (``created`` False).
    ``children`` is applied here and now: each running child is asked to cancel.
    """
    if scope == CancelScope.TASK:
        raise ValueError("a task cancel is a transition: use the cancel control")
    open_one = CancelRequest.objects.filter(
        task=task, scope=scope, status=CancelRequest.Status.PENDING
    ).first()
    if open_one is not None:
        return open_one, False
    record = request_record(task, scope, actor=actor, reason=reason, at_version=task.state_version)
    try:
        with transaction.atomic():
            record.save(force_insert=True)
    except IntegrityError:  # asked twice at once: the other request stands
        return CancelRequest.objects.get(task=task, scope=scope, status=CancelRequest.Status.PENDING), False
    if scope == CancelScope.CHILDREN:
        asked: list[UUID] = []
        try:
            asked = cancel_children(task, reason=f"children of {task.id} canceled: {reason}")
        finally:  # never left open: nothing else applies a children request
            resolve([record], applied=bool(asked), note=_children_note(asked))
            record.refresh_from_db()
    else:
        doorbell.ring(task.id, task.region)  # a worker picks it up at its next step, or its heartbeat does
    return record, True


def _children_note(asked: list[UUID]) -> str:
    return f"asked {len(asked)} running child task(s) to cancel" if asked else "no child task was running"


def pending(task_id: UUID | str) -> dict[str, CancelRequest]:
    """The open requests of a task, by scope."""
    return {
        request.scope: request
        for request in CancelRequest.objects.filter(task_id=task_id, status=CancelRequest.Status.PENDING)
    }


def pending_among(task_ids: Iterable[UUID]) -> dict[UUID, set[str]]:
    """Of ``task_ids``, those with open requests, and their scopes (one query; the heartbeat asks)."""
    ids = list(task_ids)
    found: dict[UUID, set[str]] = {}
    if ids:
        rows = CancelRequest.objects.filter(task_id__in=ids, status=CancelRequest.Status.PENDING)
        for task_id, scope in rows.values_list("task_id", "scope"):
            found.setdefault(task_id, set()).add(scope)
    return found


def call_cancel_open(task_id: UUID | str) -> Exists:
    """Subquery: the task has an open ``tool_call`` (or ``task``) request. A send's claim carries its
    negation in the same statement, so a call is never sent once such a request has committed."""
    return Exists(
        CancelRequest.objects.filter(
            task_id=task_id,
            status=CancelRequest.Status.PENDING,
            scope__in=[CancelScope.TOOL_CALL, CancelScope.TASK],
        )
    )


# Requests that stop a model turn in flight (any other waits for the worker's next step).
INTERRUPTING = frozenset({CancelScope.MODEL_TURN, CancelScope.TASK})


def resolve(requests: Iterable[CancelRequest], *, applied: bool, note: str) -> None:
    """Close requests still open (inside the caller's transaction when it has one)."""
    ids = [request.pk for request in requests]
    if not ids:
        return
    CancelRequest.objects.filter(pk__in=ids, status=CancelRequest.Status.PENDING).update(
        status=CancelRequest.Status.APPLIED if applied else CancelRequest.Status.NO_EFFECT,
        resolved_at=timezone.now(),
        resolution=note[:1000],
    )


def running_children(parent: Task) -> list[Task]:
    return list(children.running(parent.id).order_by("id"))


def cancel_children(parent: Task, *, reason: str) -> list[UUID]:
    """Ask every running child of ``parent`` to cancel (scope ``task``); return the ids asked now.

    Idempotent: a child already ``cancel_requested`` is left as it is. A child
    that moved meanwhile is read again and asked again, a few times at most.
    """
    asked = []
    for child in running_children(parent):
        for _ in range(5):
            if child.state in TERMINAL or child.state == State.CANCEL_REQUESTED:
                break
            try:
                advance(
                    child.id,
                    child.state_version,
                    State.CANCEL_REQUESTED,
                    actor=PROPAGATOR,
                    trigger=Trigger.CANCEL,
                    reason=reason,
                    reason_code=f"cancel:{CancelScope.TASK}",
                    records=[
                        request_record(
                            child,
                            CancelScope.TASK,
                            actor=PROPAGATOR,
                            reason=reason,
                            at_version=child.state_version,
                        )
                    ],
                )
                asked.append(child.id)
                doorbell.ring(child.id, child.region)
                break
            except StaleVersion:
                child = Task.objects.get(pk=child.pk)
            except (TransitionError, IntegrityError) as exc:  # e.g. an open task request already
                log.info("child not asked to cancel", extra={"task_id": str(child.id), "why": str(exc)})
                break
    return asked


def after_parent_ended(task: Task) -> None:
    """After a task's end: children it started and that still run are canceled (an expired or
    failed parent's children would otherwise go on acting for nobody). Only a type that starts
    children is asked; a canceled task already waited for its own."""
    if task.state == State.CANCELED or not registry.starts_children(task.task_type):
        return
    try:
        cancel_children(task, reason=f"parent task {task.id} ended {task.state}")
    except Exception:  # the parent's end committed; its children's own deadlines still bound them
        log.exception("could not cancel the children of an ended task", extra={"task_id": str(task.id)})
