"""Child tasks: started by a parent's step, waited for in ``waiting_children``.

A ``StartChildren`` step (``tasks.registry``) starts its children inside the
very transaction that moves the parent to ``waiting_children``: either the
parent waits and its children exist, or neither. Each child has the key
``child:<parent>:<step>:<n>``, so a step decided again never starts a second set.
A child of a parent started with a client idempotency key keys its effects by
the parent's stable scope and its position (``tasks.effect_keys``): a parent
re-created after a restore starts children whose effects have the same keys.

A child's terminal transition writes, in its own commit, an ``ExternalEvent``
for its parent (type ``child_ended``): the parent's record of how each child
ended. After that commit (hook ``tasks.hooks.after_task_ended``, registered
in ``tasks.apps``), the last child to end moves the parent on
(``children_done`` -> ``resume_validation``); the sweep does the same for a
parent whose last child's process died between the two (``wake_waiting``).
Children inherit the parent's tenant, owner, region and deadline (a child
cannot outlive the parent's deadline).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from django.db.models import QuerySet

from tasks import doorbell, effect_keys, leases
from tasks.exceptions import StaleVersion, TransitionError
from tasks.models import ExternalEvent, Task
from tasks.states import TERMINAL, State, Trigger
from tasks.transitions import CHILD_ENDED, Actor, advance

log = logging.getLogger(__name__)
WAKER = Actor.system("children")


def key(parent_id: UUID | str, step: str, index: int) -> str:
    """The child's idempotency key; its effects are keyed from its parent's scope and this position
    when the parent has a stable one (``tasks.effect_keys.scope_of``)."""
    return effect_keys.child_key(parent_id, step, index)


def of_step(parent: Task, step: str) -> list[Task]:
    """The children ``step`` of ``parent`` started, in the order it started them."""
    found = Task.objects.filter(
        tenant_id=parent.tenant_id, parent=parent, idempotency_key__startswith=f"child:{parent.id}:{step}:"
    )
    return sorted(found, key=lambda child: int((child.idempotency_key or "0").rsplit(":", 1)[1]))


def start(parent: Task, step: str, specs: Sequence[Mapping[str, Any]], *, actor: Actor) -> None:
    """Start one child per spec (``task_type``, ``objective``, ``input``), inside the caller's transaction."""
    from tasks import services  # services builds on transitions, as this module does

    for index, spec in enumerate(specs):
        services.task_create(
            tenant=parent.tenant,
            task_type=spec["task_type"],
            objective=spec.get("objective") or f"{step} #{index + 1} of {parent.id}",
            input=dict(spec.get("input") or {}),
            actor=actor,
            owner=parent.owner,
            api_token=parent.api_token if parent.api_token_id else None,  # its payments count against it too
            deadline=parent.deadline,
            idempotency_key=key(parent.id, step, index),
            parent=parent,
            region=parent.region,
            reason=f"child {index + 1} of {len(specs)} started by {parent.id} at {step}",
            nested=True,
        )


def none_running_guard(parent: Task) -> None:
    """Inside the commit that (re)enters ``waiting_children``: all children ended since we looked voids it."""
    if not running(parent.id).exists():
        raise StaleVersion("every child ended while the wait was being decided")


def tally(children: list[Task]) -> Counter[str]:
    return Counter(child.state for child in children)


def running(parent_id: UUID) -> QuerySet[Task]:
    """The children of a parent that have not ended."""
    return Task.objects.filter(parent_id=parent_id).exclude(state__in=TERMINAL)


def after_child_ended(task: Task) -> None:
    """After a child's terminal commit: move its parent on if it was the last one running.

    Best effort, never raising into the child's caller: whoever loses a race
    finds the parent moved (or still waiting on a sibling); the sweep retries.
    """
    if task.parent_id is None:
        return
    try:
        wake(task.parent_id)
    except Exception:  # the child's own transition committed; the sweep will wake the parent
        log.exception("could not wake the parent", extra={"task_id": str(task.parent_id)})


def wake(parent_id: UUID | str | None) -> bool:
    """Move a parent waiting on children on once none is running; True if this call moved it."""
    if parent_id is None:
        return False
    parent = Task.objects.filter(pk=parent_id).first()
    if parent is None:
        return False
    if parent.state == State.CANCEL_REQUESTED:
        # Its worker put it aside while the children ran (a lease held, not worked on): no longer.
        leases.end_hold(parent.id)
        doorbell.ring(parent.id, parent.region)
        return False
    if parent.state != State.WAITING_CHILDREN:
        return False
    if running(parent.id).exists():
        return False
    counts = tally(list(Task.objects.filter(parent_id=parent.id)))
    events = ExternalEvent.objects.filter(task_id=parent.id, event_type=CHILD_ENDED, applied_version=None)
    try:
        advance(
            parent.id,
            parent.state_version,
            State.RESUME_VALIDATION,
            actor=WAKER,
            trigger=Trigger.CHILDREN_DONE,
            reason="every child ended: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())),
            reason_code=Trigger.CHILDREN_DONE,
            also=(functools.partial(_mark_applied, events, parent.state_version + 1),),
        )
    except TransitionError:
        return False  # moved meanwhile (another child's wake, a cancel, an expiry)
    doorbell.ring(parent.id, parent.region)
    return True


def _mark_applied(events: QuerySet[ExternalEvent], version: int) -> None:
    events.update(applied_version=version)


def wake_waiting(region: str, limit: int = 500) -> int:
    """The sweep's part: parents of ``region`` still ``waiting_children`` although none of their
    children runs (their last child's process died before waking them)."""
    waiting = Task.objects.filter(state=State.WAITING_CHILDREN, region=region).order_by("state_entered_at")
    parent_ids = list(waiting.values_list("id", flat=True)[:limit])
    unended = Task.objects.filter(parent_id__in=parent_ids).exclude(state__in=TERMINAL)
    busy = set(unended.values_list("parent_id", flat=True))
    return sum(wake(parent_id) for parent_id in parent_ids if parent_id not in busy)
