"""Use cases composed of transitions: start a task, read where it stands,
operator controls. Nothing here assigns ``state`` directly.

Sealed columns: what a task's own rows keep of its type's sensitive fields
(``TaskType.sensitive``) is sealed where it is written (``audit.sealing``),
each value bound to the task and the column — and row — holding it: the
task's ``input`` and ``outcome``, an input answer's ``payload``, an external
event's ``payload``. Idempotency compares digests of the clear values
(``request_digest``, ``payload_digest``), never the envelopes, whose tokens
differ at every sealing. The values are opened only where they are used:
``task_input`` (a rerun, a reveal), ``event_payload`` (the engine taking an
early event's value as a fact). A completed task's outcome is only ever
shown, masked (``protection.reveal``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import IntegrityError, models, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone
from pydantic import ValidationError

from audit import canonical, sealing
from audit.chain import link_problem
from audit.keys import chain_keys
from audit.models import TransitionEvent
from audit.verify import keyed_since
from ledger import integrity
from tasks import checkpoints, doorbell, hotpath, metrics, registry
from tasks.checkpoints import Scalar
from tasks.exceptions import StaleVersion, TransitionError, TransitionNotAllowed
from tasks.leases import Held
from tasks.models import Checkpoint, ExternalEvent, Policy, RuntimeConfig, Task, TaskInput
from tasks.states import ENDED_UNDONE, RUNNABLE, TERMINAL, State, Trigger
from tasks.transitions import Actor, advance, task_start
from tenancy.models import Tenant

log = logging.getLogger(__name__)


class InvalidTaskInput(Exception):
    def __init__(self, errors: dict[str, list[str]]):
        super().__init__(errors)
        self.errors = errors


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request."""

    def __init__(self, task: Task):
        super().__init__(f"idempotency key already used for task {task.id} with a different request")
        self.task = task


def _request_digest(task_type: str, objective: str, input: dict[str, Any], deadline: datetime | None) -> str:
    # Format V1_ASCII, as every stored request_digest. ``input`` is the input model's
    # JSON-mode dump and the deadline is written here (in the caller's offset), so
    # only JSON types reach the encoder (the old ``default=str`` never applied).
    request = {
        "task_type": task_type,
        "objective": objective,
        "input": input,
        "deadline": deadline.isoformat() if deadline else None,
    }
    return canonical.digest(request, version=canonical.V1_ASCII)


def accept_input(kind: registry.TaskType, input: Any) -> dict[str, Any]:
    """``input`` as ``kind`` accepts it (its input model's JSON dump); ``InvalidTaskInput`` (field
    errors) when it does not fit."""
    try:
        accepted: dict[str, Any] = kind.input_model.model_validate(input).model_dump(mode="json")
    except ValidationError as exc:
        errors: dict[str, list[str]] = {}
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "input"
            errors.setdefault(where, []).append(error["msg"])
        raise InvalidTaskInput(errors) from None
    return accepted


def task_create(
    *,
    tenant: Tenant,
    task_type: str,
    objective: str,
    input: dict[str, Any],
    actor: Actor,
    owner: Any = None,
    deadline: datetime | None = None,
    idempotency_key: str | None = None,
    parent: Task | None = None,
    region: str | None = None,
    rerun_of: Task | None = None,
    reason: str = "",
    reason_code: str = "",
    nested: bool = False,
    first_step: str = "",
    facts: dict[str, Scalar] | None = None,
    evidence: Iterable[checkpoints.EvidenceRef] = (),
    compensates: Any = None,
    api_token: Any = None,
    task_id: UUID | None = None,
) -> tuple[Task, bool]:
    """Start a task, or return the one started before with the same key.

    ``reason`` is the creation event's (default: the objective's head), ``reason_code`` its code
    (none for a plain start; ``forked_from`` for a fork, ``tasks.forks``). ``task_id``: the new
    task's id when the caller has named it already (a fork's origin records it in the same commit).
    ``first_step``, ``facts`` and ``compensates`` (a ``ledger.Action``): a
    compensation run (``tasks.compensation``), where it starts, what it knows
    there and what it undoes; by default the type's first step and the facts
    of its input. ``evidence``: the records a fork's checkpoint had read (``tasks.forks``).
    ``api_token``: the ``tenancy.ApiToken`` the request came with, if any (the money policy's
    running totals per token count the task's payments against it).
    ``nested``: inside the caller's transaction (a parent starting children);
    the doorbell rings once that commits.
    Returns ``(task, created)``. Raises ``InvalidTaskInput`` (field errors)
    when the input does not fit the task type, and ``IdempotencyConflict``
    when the key was used before with a different request.
    """
    kind = registry.get(task_type)
    accepted = accept_input(kind, input)
    digest = _request_digest(task_type, objective, accepted, deadline)

    def existing() -> Task | None:
        found = Task.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if found is not None and found.request_digest != digest:
            raise IdempotencyConflict(found)
        return found

    if idempotency_key:
        found = existing()
        if found is not None:
            return found, False
    policy = Policy.objects.filter(task_type=task_type).values_list("version", flat=True).first()
    config = RuntimeConfig.objects.filter(task_type=task_type, current=True).first()
    task = Task(
        **({"id": task_id} if task_id is not None else {}),
        tenant=tenant,
        task_type=task_type,
        objective=objective,
        input=accepted,
        owner=owner,
        api_token=api_token,
        deadline=deadline,
        idempotency_key=idempotency_key or None,
        request_digest=digest,
        parent=parent,
        rerun_of=rerun_of,
        compensates=compensates,
        region=region or settings.WORKER_REGION,
        policy_version=policy or settings.DEFAULT_POLICY_VERSION,
        model_id=config.model_id if config else kind.model_id,
        prompt_id=config.prompt_id if config else kind.prompt_id,
        toolset_id=config.toolset_id if config else kind.toolset_id,
    )
    task.input = seal_input(task_type, task.id, accepted)  # the id exists already (uuid7 default)
    progress = checkpoints.Progress(
        step=first_step or kind.first_step,
        input_refs=[f"task:{task.id}/input"],
        facts=kind.initial_facts(accepted) if facts is None else facts,
        evidence=list(evidence),
    )
    try:
        task = task_start(
            task,
            actor=actor,
            progress=progress,
            reason=(reason or objective)[:200],
            reason_code=reason_code,
            durable=not nested,
        )
        if nested:
            transaction.on_commit(functools.partial(doorbell.ring, task.id, task.region))
        else:
            doorbell.ring(task.id, task.region)
        return task, True
    except IntegrityError:
        # Lost a race with the same key: the winner's task is the answer.
        found = existing() if idempotency_key else None
        if found is None:
            raise
        return found, False


# Ended tasks an operator may run again as a new task; a completed one is done, not rerun.
RERUNNABLE = ENDED_UNDONE


def task_rerun(
    task: Task,
    *,
    actor: Actor,
    reason: str,
    idempotency_key: str | None = None,
    deadline: datetime | None = None,
) -> tuple[Task, bool]:
    """Start a new task that runs ``task`` again; ``task`` itself is never written.

    The new task has the same type, objective, input, owner, API token, tenant,
    parent and region, and ``rerun_of=task``. It is a new idempotency scope: a new id, so
    its ledger keys (task id + step + effect) differ from the old task's, and
    no task-level ``idempotency_key`` unless the caller gives one (the same key
    again returns the same rerun, ``created=False``). The old deadline is not
    carried over (an expired task's has passed): ``deadline`` sets a new one.
    Its creation event says which task it reruns and why. An effect the old task
    (or one it reran) already completed is not sent again: the engine reuses its
    outcome (``runtime.engine``, ``effect_reused``).

    Refuses with ``TransitionNotAllowed`` unless ``task`` is failed, expired
    or canceled; ``InvalidTaskInput`` when the old input no longer fits the
    task type; ``IdempotencyConflict`` for a key used by another request.
    """
    if task.state not in RERUNNABLE:
        raise TransitionNotAllowed(
            f"only a failed, expired or canceled task can be rerun; this one is {task.state}",
            state=task.state,
            state_version=task.state_version,
        )
    if task.compensates_id is not None:  # run again as a whole, it would redo what it was to undo
        raise TransitionNotAllowed(
            f"a compensation run is not rerun: try again from task {task.rerun_of_id}'s effects left done",
            state=task.state,
            state_version=task.state_version,
        )
    try:
        submitted = task_input(task)
    except sealing.Unopenable as exc:  # a retired key, or erased by retention: nothing to run again with
        raise InvalidTaskInput({"input": [f"{exc.where} cannot be read ({exc.problem})"]}) from None
    return task_create(
        tenant=task.tenant,
        task_type=task.task_type,
        objective=task.objective,
        input=submitted,
        actor=actor,
        owner=task.owner,
        api_token=task.api_token,  # its payments still count against the token that asked for them
        deadline=deadline,
        idempotency_key=idempotency_key,
        parent=task.parent,
        region=task.region,
        rerun_of=task,
        reason=f"rerun of {task.id} ({task.state}): {reason}",
    )


# --- sealed columns ----------------------------------------------------------------------------------


def seal_input(task_type: str, task_id: UUID, accepted: dict[str, Any]) -> dict[str, Any]:
    """The accepted input as ``Task.input`` stores it: the type's sensitive fields sealed to this task."""
    return sealing.seal_fields(
        accepted, registry.sensitive_fields(task_type), sealing.task_place(task_id, "input")
    )


def task_input(task: Task) -> Any:
    """The task's input as it was submitted (sealed fields opened), to start work from (a rerun, a
    compensation run).

    Raises ``sealing.Unopenable``, and ``InvalidTaskInput`` (``input_digest_mismatch``) when the
    stored input and objective are not what the task's ``request_digest`` says was submitted:
    changed in the database, so nothing may be started from them.
    """
    submitted = sealing.open_all(task.input, sealing.task_place(task.id, "input"))
    if task.request_digest and task.request_digest != _request_digest(
        task.task_type, task.objective, submitted, task.deadline
    ):
        log.error("task input not as submitted", extra={"task_id": str(task.id)})
        raise InvalidTaskInput(
            {
                "input": [
                    f"{integrity.INPUT_DIGEST_MISMATCH}: the stored input is not what was submitted "
                    "(it differs from the task's request digest): nothing is started from it"
                ]
            }
        )
    return submitted


def outcome_fields(task_type: str) -> frozenset[str]:
    """The sensitive facts a completed task of ``task_type`` reports in its outcome: only those are sealed
    and masked there (its other keys are the system's own words: ``{"reason": "retries_exhausted"}``)."""
    try:
        kind = registry.get(task_type)
    except KeyError:
        return frozenset()
    return kind.sensitive & kind.outcome_fields


def seal_outcome(task: Task, outcome: dict[str, Any]) -> dict[str, Any]:
    """A completed task's outcome as ``Task.outcome`` stores it: its sensitive facts sealed to this task."""
    return sealing.seal_fields(
        outcome, outcome_fields(task.task_type), sealing.task_place(task.id, "outcome")
    )


def task_outcome(task: Task) -> Any:
    """The task's outcome in clear (sealed facts opened). Raises ``sealing.Unopenable``."""
    return sealing.open_all(task.outcome, sealing.task_place(task.id, "outcome"))


def event_sensitive_keys(task_type: str, event_type: str) -> frozenset[str]:
    """The payload keys of an ``event_type`` event sealed at rest: those named like a sensitive field of
    the type, and each key a wait for that event reads a sensitive fact from (``AwaitExternal.value``)."""
    sensitive = registry.sensitive_fields(task_type)
    if not sensitive:
        return frozenset()
    waits = [
        step
        for step in registry.get(task_type).steps
        if isinstance(step, registry.AwaitExternal) and step.event_type == event_type
    ]
    return sensitive | {step.value for step in waits if step.fact in sensitive}


def event_payload(event: ExternalEvent) -> Any:
    """An external event's payload as delivered (sealed values opened). Raises ``sealing.Unopenable``."""
    return sealing.open_all(
        event.payload, sealing.task_place(event.task_id, "events", event.event_key, "payload")
    )


def _latest_checkpoint_row(task_id: UUID) -> QuerySet[Checkpoint]:
    recorded = TransitionEvent.objects.filter(
        task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
    ).values("checkpoint_digest")[:1]
    return (
        Checkpoint.objects.filter(task_id=task_id)
        .annotate(recorded_digest=Subquery(recorded))
        .order_by("-state_version")[:1]
    )


def latest_checkpoint(
    task: Task, *, vouched: bool = False, stored: hotpath.Stored | None = None
) -> checkpoints.Checkpoint:
    """Verify, decode (and migrate) the task's newest checkpoint.

    The row comes with the digest its audit event recorded (one query), and
    ``checkpoints.decode_stored`` refuses a body that is not what that
    transition wrote. ``vouched`` (what a worker resumes from): also that the
    event recording it is a keyed link (``audit.chain.link_problem``), since the
    app role may insert checkpoints and events but cannot key them; the row and
    its whole event are then read together (``hotpath.newest_checkpoint``, one
    query), or not at all when ``stored`` (a claim's read of them) is still the
    newest at the task's version (``Stored.current_for``). Raises
    ``CheckpointUnreadable`` — including reason ``checkpoint_missing`` when the
    task has none.
    """
    if not vouched:
        row = hotpath.load("latest_checkpoint", _latest_checkpoint_row, task.pk)
        if row is None:
            raise checkpoints.CheckpointUnreadable("checkpoint_missing", "task has no checkpoint")
        return checkpoints.decode_stored(row, recorded_digest=row.recorded_digest)
    if stored is None or not stored.current_for(task):
        stored = hotpath.newest_checkpoint(task.pk)
    if stored.checkpoint is None:
        raise checkpoints.CheckpointUnreadable("checkpoint_missing", "task has no checkpoint")
    if stored.recorded_digest:
        problem = stored.event and link_problem(stored.event, chain_keys(), keyed_since)
        if problem:
            raise checkpoints.CheckpointUnreadable(checkpoints.CheckpointUnreadable.DIGEST_MISMATCH, problem)
    return checkpoints.decode_stored(stored.checkpoint, recorded_digest=stored.recorded_digest)


@dataclass(frozen=True)
class ResumePoint:
    task: Task
    checkpoint: checkpoints.Checkpoint | None  # None: the task was quarantined, or left to newer code
    # The checkpoint was written by a newer deployment: the task was left as it is, for that one's workers.
    newer: bool = False

    @property
    def quarantined(self) -> bool:
        return self.checkpoint is None and not self.newer


def task_resume_point(
    task_id: UUID | str,
    *,
    actor: Actor,
    lease: Held | None = None,
    task: Task | None = None,
    stored: hotpath.Stored | None = None,
) -> ResumePoint:
    """Load a task (unless ``task``, its row as a claim just read it) and the checkpoint it would resume
    from (not read again if ``stored``, the claim's read of it, is still the newest at the task's version).

    A checkpoint the running code cannot use (corrupt, unmigratable, missing,
    undecryptable, tampered) quarantines the task with that machine-readable
    reason instead of raising: nothing resumes from a guess. Raises
    ``StaleVersion`` only if the task moved while it was being quarantined.

    A checkpoint of a newer schema is no fault of the task: a newer deployment
    wrote it, and its workers will resume it (a mixed-version rollout). The task
    is left untouched — no transition — and the point says ``newer``; the caller
    lets go of it (a worker releases its lease).
    """
    if task is None or task.pk != Task._meta.pk.to_python(task_id):
        task, stored = hotpath.load_task(task_id), None
    if task is None:
        raise Task.DoesNotExist(f"task {task_id} does not exist")
    try:
        return ResumePoint(task, latest_checkpoint(task, vouched=True, stored=stored))
    except checkpoints.CheckpointUnreadable as exc:
        if task.state == State.QUARANTINED:
            return ResumePoint(task, None)
        metrics.checkpoint_unreadable(exc.reason)  # durable_checkpoint_read_failures
        if exc.reason == checkpoints.CheckpointUnreadable.SCHEMA_NEWER:
            log.warning(
                "checkpoint written by newer code; leaving the task to a newer deployment",
                extra={
                    "task_id": str(task.id),
                    "state_version": task.state_version,
                    "detail": exc.detail,
                    "deployment": settings.DEPLOYMENT_ID,
                },
            )
            return ResumePoint(task, None, newer=True)
        task = advance(
            task.id,
            task.state_version,
            State.QUARANTINED,
            actor=actor,
            trigger=Trigger.QUARANTINE,
            reason=exc.detail,
            reason_code=exc.reason,
            lease=lease,
        )
        return ResumePoint(task, None)


def ring_if_runnable(task: Task) -> None:
    if task.state in RUNNABLE:
        doorbell.ring(task.id, task.region)


def _digest(payload: Any) -> str:
    """A task input's payload digest, format V1_ASCII as every stored ``payload_digest``."""
    return canonical.digest(payload, version=canonical.V1_ASCII)


@dataclass(frozen=True)
class Delivery:
    task: Task
    applied: bool  # False: a duplicate, acknowledged and not applied again
    note: str = ""


def _waiting_step(task: Task, kind: type) -> tuple[checkpoints.Checkpoint, Any]:
    point = latest_checkpoint(task)
    step = registry.get(task.task_type).step(point.step)
    if not isinstance(step, kind):
        raise TransitionNotAllowed(
            f"the task is not waiting at a {kind.__name__} step",
            state=task.state,
            state_version=task.state_version,
        )
    return point, step


def task_provide_input(
    task: Task,
    *,
    expected_version: int,
    answer: Scalar,
    actor: Actor,
    records: Iterable[models.Model] = (),
) -> Delivery:
    """Answer a task in ``waiting_input``; it then goes through resume validation.

    The same answer posted again for the same wait is acknowledged and not
    applied twice (``applied=False``); a different answer for a wait already
    answered, or one at a stale version, raises ``StaleVersion``.
    Raises ``TransitionNotAllowed`` when the task is not waiting for input.
    ``records``: the caller's rows that commit with the answer or not at all (the
    A2A message that carried it).
    """
    payload = {"answer": answer}
    earlier = TaskInput.objects.filter(task=task, answered_version=expected_version).first()
    if earlier is not None and earlier.payload_digest == _digest(payload):
        return Delivery(task, applied=False, note="this answer was already applied")
    if task.state_version != expected_version:
        raise StaleVersion(
            f"task is at version {task.state_version}, not {expected_version}",
            state=task.state,
            state_version=task.state_version,
        )
    if task.state != State.WAITING_INPUT:
        raise TransitionNotAllowed(
            "the task is not waiting for input", state=task.state, state_version=task.state_version
        )
    point, step = _waiting_step(task, registry.RequestInput)
    now = timezone.now()
    # Digest of the clear answer (a repeat is recognised by it); the row keeps it sealed when the fact is.
    sealed = {"answer"} if step.answer in registry.sensitive_fields(task.task_type) else set()
    record = TaskInput(
        task=task,
        answered_version=expected_version,
        payload=sealing.seal_fields(
            payload, sealed, sealing.task_place(task.id, "inputs", expected_version, "payload")
        ),
        payload_digest=_digest(payload),
        submitted_by=actor.id,
        received_at=now,
    )
    progress = point.progress.model_copy(
        update={
            "step": step.next,
            "facts": {**point.facts, step.answer: answer},
            "input_refs": [*point.input_refs, f"input:v{expected_version}"],
        }
    )
    try:
        task = advance(
            task.id,
            expected_version,
            State.RESUME_VALIDATION,
            actor=actor,
            trigger=Trigger.INPUT_RECEIVED,
            reason=f"answer to: {step.question}"[:200],
            progress=progress,
            records=[record, *records],
        )
    except IntegrityError:  # the same wait answered concurrently
        return task_provide_input(
            Task.objects.get(pk=task.pk), expected_version=expected_version, answer=answer, actor=actor
        )
    ring_if_runnable(task)
    return Delivery(task, applied=True)


class EventRefused(TransitionError):
    """An external event the task does not take; nothing was stored. ``code`` says why."""

    def __init__(self, message: str, *, code: str, state: str, state_version: int):
        super().__init__(message, state=state, state_version=state_version)
        self.code = code


def _may_take_event(task_id: UUID, state: str, state_version: int, *, key: str) -> None:
    """Refuse event ``key`` for an ended task, or past ``EXTERNAL_EVENTS_MAX_PER_TASK`` other events.

    Without a bound, anyone allowed to feed a task could grow its table without
    end (events are kept for as long as the task). Counted up to the limit only;
    ``key`` itself is not counted (the check also runs after its row was written).
    """
    if state in TERMINAL:
        raise EventRefused(
            f"The task has already ended ({state}): it takes no new external events.",
            code="task_ended",
            state=state,
            state_version=state_version,
        )
    limit = settings.EXTERNAL_EVENTS_MAX_PER_TASK
    others = ExternalEvent.objects.filter(task_id=task_id).exclude(event_key=key).order_by()
    if others[:limit].count() >= limit:
        raise EventRefused(
            f"The task already holds {limit} external events, the most one task takes"
            " (EXTERNAL_EVENTS_MAX_PER_TASK); repeats of those keys are still acknowledged.",
            code="too_many_events",
            state=state,
            state_version=state_version,
        )


def task_deliver_event(
    task: Task, *, event_key: str, event_type: str, payload: dict[str, Any], actor: Actor
) -> Delivery:
    """Record an external event once per ``event_key``; end the wait it answers.

    A duplicate key is acknowledged and applied nothing (``applied=False``),
    even once the task ended. An event the task is not (yet) waiting for is
    kept, and applied when the task reaches the step that waits for it.

    Refuses a new key (``EventRefused``, nothing stored): ``task_ended`` when
    the task is terminal, ``too_many_events`` when it already holds
    ``EXTERNAL_EVENTS_MAX_PER_TASK`` events. Both are checked again under the
    task's row lock, so concurrent deliveries cannot slip past either.
    """

    def again() -> Delivery:
        return task_deliver_event(
            Task.objects.get(pk=task.pk),
            event_key=event_key,
            event_type=event_type,
            payload=payload,
            actor=actor,
        )

    if ExternalEvent.objects.filter(task=task, event_key=event_key).exists():
        return Delivery(task, applied=False, note="duplicate event_key: already received")
    _may_take_event(task.id, task.state, task.state_version, key=event_key)
    now = timezone.now()
    stored = sealing.seal_fields(
        payload,
        event_sensitive_keys(task.task_type, event_type),
        sealing.task_place(task.id, "events", event_key, "payload"),
    )
    event = ExternalEvent(
        task=task, event_key=event_key, event_type=event_type, payload=stored, received_at=now
    )
    step = None
    if task.state == State.WAITING_EXTERNAL:
        try:
            point, step = _waiting_step(task, registry.AwaitExternal)
        except (TransitionNotAllowed, checkpoints.CheckpointUnreadable):
            step = None  # not a wait this event can end; keep it (a worker will sort the task out)
    if step is None or step.event_type != event_type:
        with transaction.atomic():
            # Under the task's row lock, so a worker cannot begin the matching wait between our look
            # and our insert (its commit re-checks for stored events after taking the same lock).
            current = (
                Task.objects.select_for_update().filter(pk=task.pk).values_list("state_version", flat=True)
            )
            moved = current.get() != task.state_version
            if not moved:
                if ExternalEvent.objects.filter(task=task, event_key=event_key).exists():
                    return Delivery(task, applied=False, note="duplicate event_key: already received")
                # Counted again under the lock: concurrent deliveries of new keys queue here one by one.
                _may_take_event(task.id, task.state, task.state_version, key=event_key)
                try:
                    with transaction.atomic():
                        event.save(force_insert=True)
                except IntegrityError:
                    return Delivery(task, applied=False, note="duplicate event_key: already received")
        if moved:
            return again()
        return Delivery(task, applied=True, note="stored until the task waits for it")
    event.applied_version = task.state_version + 1
    progress = point.progress.model_copy(
        update={
            "step": step.next,
            "facts": {**point.facts, step.fact: checkpoints.as_fact(payload.get(step.value))},
            "input_refs": [*point.input_refs, f"event:{event_key}"],
        }
    )
    try:
        task = advance(
            task.id,
            task.state_version,
            State.RESUME_VALIDATION,
            actor=actor,
            trigger=Trigger.EXTERNAL_EVENT,
            reason=f"{event_type} {event_key}"[:200],
            progress=progress,
            records=[event],
            also=[functools.partial(_may_take_event, task.id, task.state, task.state_version, key=event_key)],
        )
    except IntegrityError:
        return Delivery(
            Task.objects.get(pk=task.pk), applied=False, note="duplicate event_key: already received"
        )
    except StaleVersion:
        return again()  # the task moved while we looked: deliver against where it is now
    ring_if_runnable(task)
    return Delivery(task, applied=True)
