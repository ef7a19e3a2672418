"""Which key scheme and scope a task's effects are keyed by (``ledger.keys``): the one choice.

Every writer of an intent (``tasks.transitions``) and everything that computes
a task's key again (the engine's "the facts changed after intent" check, the
money policy's movement, the soak, tests) asks ``scope_of``. A key already
stored is never recomputed to find or reconcile its action.
"""

from __future__ import annotations

from uuid import UUID

from ledger import keys
from ledger.models import Action
from tasks.models import Task


def child_key(parent_id: UUID | str, step: str, index: int) -> str:
    """A child's task-level idempotency key: ``child:<parent>:<step>:<n>`` (``tasks.children``)."""
    return f"child:{parent_id}:{step}:{index}"


def child_position(task: Task) -> str | None:
    """``<step>:<n>`` of a child started by its parent's step (``child_key``); None for any other task."""
    prefix = f"child:{task.parent_id}:"
    if task.parent_id is None or not (task.idempotency_key or "").startswith(prefix):
        return None
    return (task.idempotency_key or "")[len(prefix) :]


def scope_of(task: Task, scheme: int | None = None) -> keys.Scope:
    """The scope of ``task``'s effect keys; ``scheme``: the one an action of it was written with.

    ``INTENT`` (stable across the task database) when the task has an identity of the caller's:
    - a child of a parent that has one: the parent's scope and the child's position;
    - a compensation run undoing an action keyed by ``INTENT``: that key and the run's number;
    - any other task started with a client idempotency key: tenant, task type and that key.
    A task re-created with the same client key after a restore or a lost commit gets the same
    keys, and the authoritative system answers a repeated key with its first result.

    ``TASK`` (the task's id, the scheme of every action written before) otherwise: a task without
    a client key, a child of such a task, and a rerun started without a key of its own. A rerun is
    a new intent by an operator: it never takes its original's scope (with a key of its own, it is
    scoped by that key); what stops it paying again is the engine's reuse of its original's
    settled effect (``runtime.engine``, ``effect_reused``).
    """
    if scheme == keys.Scheme.TASK:
        return keys.task_scope(task.id)
    return _stable_scope(task) or keys.task_scope(task.id)


def _stable_scope(task: Task) -> keys.Scope | None:
    if task.compensates_id is not None:
        undone = (
            Action.objects.filter(pk=task.compensates_id).values_list("idempotency_key", "key_scheme").first()
        )
        if undone is None or undone[1] != keys.Scheme.INTENT:
            return None
        earlier = Task.objects.filter(compensates_id=task.compensates_id, id__lt=task.id).count()
        return keys.compensation_scope(task.tenant_id, undone[0], earlier)
    position = child_position(task)
    if position is not None and task.parent_id is not None:
        parent = Task.objects.filter(pk=task.parent_id).first()
        inherited = _stable_scope(parent) if parent is not None else None
        if inherited is None:
            return None
        return keys.child_scope(inherited, task.tenant_id, task.task_type, position)
    if task.idempotency_key:
        return keys.intent_scope(task.tenant_id, task.task_type, task.idempotency_key)
    return None
