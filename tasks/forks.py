"""Resume an ended task from one of its checkpoints, as a new task (what Temporal calls reset and DBOS fork).

An operator picks a checkpoint version N of a task that has ended (completed, failed, expired or
canceled) and starts a *fork*: a new task of the same type, objective, owner, tenant, parent and
region, linked to the original (``rerun_of``), whose first checkpoint is where version N stood.

What a fork carries, and what it does not:

- **Carried**: checkpoint N's step, its facts and the evidence it had read. An input field the task
  type names in ``fork_editable`` may be changed; the facts the type derives from its input
  (``initial_facts``) follow the change, every other fact stays as N had it. A type that names none
  keeps its input as submitted.
- **Not carried**: the ledger and the approvals. N's tool calls, pending actions and approval
  references are left behind; approval requests and decisions are never copied. The fork is a new
  idempotency scope (its own id, so its own ledger keys), and every approval its steps need is asked
  again, of someone other than the operator who forked it (``approvals.authority.lineage``).
- **Never sent twice blindly**: an effect the original (or a task it reruns) already completed is
  reused, not sent again, when the fork reaches the same step with the same effect
  (``runtime.engine``, ``effect_reused``); an effect that differs (an edited amount) goes through its
  step's approval, which shows the earlier effect of the same business reference (``ledger.money``).

Both histories say so in one commit: the original gets an audited self-loop (trigger ``fork``,
reason code ``forked``) naming the fork and the version — it stays in its terminal state with the
reason it ended for — and the fork's creation event (reason code ``forked_from``) names the original
and the version (``origin`` reads it back).

Refused, nothing written, with ``ForkRefused``: a version with no checkpoint (``checkpoint_not_found``),
a task that has not ended or is a compensation run, a step the type no longer has (``not_forkable``), an
input field the type does not let a fork change (``input_not_editable``); with ``CheckpointUnreadable``
for a checkpoint that fails verification (altered, or not vouched for by a keyed audit event); with
``InvalidTaskInput`` for an input the type refuses.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import OuterRef, Subquery

from audit import sealing
from audit.chain import link_problem
from audit.keys import chain_keys
from audit.models import TransitionEvent
from audit.verify import keyed_since
from tasks import checkpoints, registry, services
from tasks.checkpoints import CheckpointUnreadable
from tasks.ids import uuid7
from tasks.models import Checkpoint, Task
from tasks.states import TERMINAL, Trigger
from tasks.transitions import Actor, advance

# The reason codes of the two events a fork writes (tasks/reasons.py says what they mean).
FORKED = "forked"  # on the original
FORKED_FROM = "forked_from"  # the fork's creation
FORKABLE = TERMINAL

# The creation event's reason starts with this; ``origin`` reads the version back from it.
_ORIGIN = re.compile(r"^fork of task (?P<task>[0-9a-f-]{36}) from checkpoint v(?P<version>\d+)")


class ForkRefused(Exception):
    """Nothing was started or written; ``code`` says why (``checkpoint_not_found``, ``not_forkable``,
    ``input_not_editable``)."""

    NOT_FOUND = "checkpoint_not_found"
    NOT_FORKABLE = "not_forkable"
    NOT_EDITABLE = "input_not_editable"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _AlreadyStarted(Exception):
    """The idempotency key started this fork before: the original's event must not be written again."""

    def __init__(self, task: Task) -> None:
        super().__init__(str(task.pk))
        self.task = task


@dataclass(frozen=True)
class Origin:
    task_id: UUID
    version: int


def editable_fields(task_type: str) -> frozenset[str]:
    """The input fields a fork of ``task_type`` may change (none for an unknown or silent type)."""
    if task_type not in registry.names():
        return frozenset()
    return registry.get(task_type).fork_editable


def refusal(task: Task) -> str:
    """Why ``task`` cannot be forked at all, or "" when it can (the version is checked on the fork)."""
    if task.state not in FORKABLE:
        return (
            f"only an ended task (completed, failed, expired or canceled) is resumed from a checkpoint; "
            f"this one is {task.state}: cancel it first"
        )
    if task.compensates_id is not None:  # it undoes an effect: run again from a point, it would redo it
        return "a compensation run is not resumed from a checkpoint: start a compensation of the effect again"
    if task.task_type not in registry.names():
        return f"task type {task.task_type!r} is not registered in this deployment"
    return ""


def checkpoint_at(task: Task, version: int) -> checkpoints.Checkpoint:
    """Checkpoint ``version`` of ``task``, verified as a worker would before resuming from it.

    The body must be what its transition wrote (the digest its audit event recorded,
    ``checkpoints.decode_stored``), and that event a keyed link of the chain (the app role may insert
    rows but cannot key them). Raises ``ForkRefused`` (``checkpoint_not_found``) and
    ``CheckpointUnreadable`` (``checkpoint_digest_mismatch`` and the other decoding reasons).
    """
    recorded = TransitionEvent.objects.filter(
        task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
    ).values("checkpoint_digest")[:1]
    row = (
        Checkpoint.objects.filter(task=task, state_version=version)
        .annotate(recorded_digest=Subquery(recorded))
        .first()
    )
    if row is None:
        raise ForkRefused(ForkRefused.NOT_FOUND, f"task {task.pk} has no checkpoint at version {version}")
    if row.recorded_digest:
        event = TransitionEvent.objects.filter(task_id=task.pk, state_version=version).first()
        problem = event and link_problem(event, chain_keys(), keyed_since)
        if problem:
            raise CheckpointUnreadable(CheckpointUnreadable.DIGEST_MISMATCH, problem)
    return checkpoints.decode_stored(row, recorded_digest=row.recorded_digest)


def _facts(
    kind: registry.TaskType, point: checkpoints.Checkpoint, before: dict[str, Any], after: dict[str, Any]
) -> dict[str, Any]:
    """Checkpoint ``point``'s facts, with those the type derives from its input following an edit."""
    facts = dict(point.facts)
    if after != before:
        old, new = kind.initial_facts(before), kind.initial_facts(after)
        facts.update({name: value for name, value in new.items() if old.get(name) != value})
    return facts


def task_fork(
    task: Task,
    *,
    version: int,
    actor: Actor,
    reason: str,
    input_changes: Mapping[str, Any] | None = None,
    idempotency_key: str | None = None,
    deadline: datetime | None = None,
) -> tuple[Task, bool]:
    """Start a new task from checkpoint ``version`` of the ended ``task`` (see the module's docstring).

    ``input_changes``: new values of input fields the type names in ``fork_editable``. The same
    ``idempotency_key`` again returns the same fork, ``created=False``, writing nothing.
    Returns ``(fork, created)``; raises ``ForkRefused``, ``CheckpointUnreadable``,
    ``services.InvalidTaskInput`` and ``services.IdempotencyConflict``.
    """
    why = refusal(task)
    if why:
        raise ForkRefused(ForkRefused.NOT_FORKABLE, why)
    kind = registry.get(task.task_type)
    changes = dict(input_changes or {})
    locked = sorted(set(changes) - kind.fork_editable)
    if locked:
        allowed = ", ".join(sorted(kind.fork_editable)) or "none"
        raise ForkRefused(
            ForkRefused.NOT_EDITABLE,
            f"{task.task_type} does not let a fork change {', '.join(locked)} (editable: {allowed})",
        )
    point = checkpoint_at(task, version)
    if kind.step(point.step) is None:
        raise ForkRefused(
            ForkRefused.NOT_FORKABLE,
            f"step {point.step!r} of version {version} is no longer a step of {kind.name}",
        )
    try:
        submitted = services.task_input(task)
    except sealing.Unopenable as exc:  # a retired key, or erased by retention: nothing to start from
        raise services.InvalidTaskInput({"input": [f"{exc.where} cannot be read ({exc.problem})"]}) from None
    accepted = services.accept_input(kind, {**submitted, **changes})
    fork_id = uuid7()
    edited = f" with {', '.join(sorted(changes))} changed" if changes else ""

    def start() -> None:
        fork, created = services.task_create(
            tenant=task.tenant,
            task_type=task.task_type,
            objective=task.objective,
            input=accepted,
            actor=actor,
            owner=task.owner,
            api_token=task.api_token,
            deadline=deadline,
            idempotency_key=idempotency_key,
            parent=task.parent,
            region=task.region,
            rerun_of=task,
            reason=f"fork of task {task.id} from checkpoint v{version}{edited}: {reason}",
            reason_code=FORKED_FROM,
            nested=True,
            first_step=point.step,
            facts=_facts(kind, point, submitted, accepted),
            evidence=point.evidence,
            task_id=fork_id,
        )
        if not created:  # the key started a fork before: of this version, or it names another request
            if origin(fork) != Origin(task.id, version):
                raise services.IdempotencyConflict(fork)
            raise _AlreadyStarted(fork)

    try:
        advance(
            task.id,
            task.state_version,
            task.state,
            actor=actor,
            trigger=Trigger.FORK,
            reason=f"resumed from checkpoint v{version} as task {fork_id}{edited}: {reason}",
            reason_code=FORKED,
            also=[start],
        )
    except _AlreadyStarted as exc:
        return exc.task, False
    return Task.objects.select_related("tenant", "owner").get(pk=fork_id), True


def origin(task: Task) -> Origin | None:
    """The task and checkpoint version ``task`` was forked from, as its creation event says; None when
    it was not started by a fork."""
    if task.rerun_of_id is None:
        return None
    reason = (
        TransitionEvent.objects.filter(task=task, state_version=1, reason_code=FORKED_FROM)
        .values_list("reason", flat=True)
        .first()
    )
    found = _ORIGIN.match(reason or "")
    if found is None:
        return None
    return Origin(UUID(found["task"]), int(found["version"]))
