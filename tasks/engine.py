"""The agent step: from a task and its checkpoint, decide the next transition.

``decide`` does the step's bounded work (read evidence, ask the model) and
returns a ``Decision``; it writes nothing. The runner commits the decision
through ``advance`` at the version it was computed from — so a decision made
from an old version is discarded, never applied over newer state.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from tasks import evidence, registry, validation
from tasks.checkpoints import Checkpoint, EvidenceRef, Progress
from tasks.decisions import Decision, quarantine, retry_later
from tasks.llm import Model, ModelUnavailable
from tasks.models import ExternalEvent, Task
from tasks.states import State, Trigger

MAX_FACT_LENGTH = 2000


def _scalar(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)[:MAX_FACT_LENGTH]


def decide(task: Task, checkpoint: Checkpoint, *, model: Model, now: datetime) -> Decision:
    kind = registry.get(task.task_type)
    progress = checkpoint.progress
    if task.state == State.RESUME_VALIDATION:
        return validation.validate(task, checkpoint, kind, now)
    if task.state == State.CANCEL_REQUESTED:
        return Decision(
            State.CANCELED,
            Trigger.CANCEL_CONFIRMED,
            progress,
            reason_code=task.state_reason,
            changes={"outcome": {"canceled": task.state_reason, "effects_not_undone": []}},
        )
    if checkpoint.deployment != settings.DEPLOYMENT_ID:
        written_by = checkpoint.deployment or "an unrecorded deployment"
        return Decision(
            State.RESUME_VALIDATION,
            Trigger.DEPLOYMENT_CHANGED,
            progress,
            reason_code="deployment_changed",
            reason=f"checkpoint written by {written_by}, resuming on {settings.DEPLOYMENT_ID}",
        )
    step = kind.step(checkpoint.step)
    if step is None:
        return quarantine(progress, "unknown_step", f"step {checkpoint.step!r} is not part of {kind.name}")
    return _run_step(task, kind, step, progress, model=model, now=now)


def _advance_to(progress: Progress, step: str, task: Task, **update: Any) -> Decision:
    changes = {"attempt": 0} if task.attempt else {}  # a step that works ends the retry streak
    return Decision(
        State.READY, Trigger.STEP, progress.model_copy(update={"step": step, **update}), changes=changes
    )


def _run_step(
    task: Task,
    kind: registry.TaskType,
    step: registry.Step,
    progress: Progress,
    *,
    model: Model,
    now: datetime,
) -> Decision:
    facts = dict(progress.facts)
    match step:
        case registry.ReadEvidence():
            record_id = str(facts.get(step.record_from, ""))
            try:
                record = evidence.fetch(step.system, record_id)
            except evidence.EvidenceUnavailable as exc:
                return retry_later(task, kind, progress, now, code="evidence_unavailable", reason=str(exc))
            except evidence.EvidenceMissing as exc:
                return Decision(
                    State.FAILED,
                    Trigger.FAIL,
                    progress,
                    reason=str(exc),
                    reason_code="evidence_missing",
                    changes={"outcome": {"reason": "evidence_missing", "record": record_id}},
                )
            facts.update({fact: _scalar(record.data.get(name)) for name, fact in step.facts.items()})
            ref = EvidenceRef(
                system=record.system,
                record_id=record.record_id,
                record_version=record.version,
                fetched_at=now,
            )
            kept = [e for e in progress.evidence if (e.system, e.record_id) != (ref.system, ref.record_id)]
            return _advance_to(progress, step.next, task, facts=facts, evidence=[*kept, ref])
        case registry.ModelTurn():
            try:
                reply = model.complete(prompt_id=step.prompt_id, system=step.instructions, facts=facts)
            except ModelUnavailable as exc:
                return retry_later(task, kind, progress, now, code="model_unavailable", reason=str(exc))
            answer = reply.text.strip()[:MAX_FACT_LENGTH]
            facts[step.output] = answer
            facts[f"{step.output}_model"] = reply.model_id  # which model produced this advisory answer
            return _advance_to(progress, step.routes.get(answer) or step.next, task, facts=facts)
        case registry.RequestInput():
            if step.answer in facts:  # answered before this step was reached again (refresh, replan)
                return _advance_to(progress, step.next, task)
            return Decision(
                State.WAITING_INPUT,
                Trigger.REQUEST_INPUT,
                progress.model_copy(update={"step": step.name}),
                reason=step.question,
                changes={"wait_deadline": now + step.timeout},
            )
        case registry.AwaitExternal():
            if step.fact in facts:
                return _advance_to(progress, step.next, task)
            # An event that arrived before the task got here is applied now, not lost.
            early = (
                ExternalEvent.objects.filter(task=task, event_type=step.event_type)
                .order_by("received_at")
                .first()
            )
            if early is not None:
                facts[step.fact] = _scalar(early.payload.get(step.value))
                return _advance_to(
                    progress,
                    step.next,
                    task,
                    facts=facts,
                    input_refs=[*progress.input_refs, f"event:{early.event_key}"],
                )
            return Decision(
                State.WAITING_EXTERNAL,
                Trigger.AWAIT_EXTERNAL,
                progress.model_copy(update={"step": step.name}),
                reason=f"waiting for {step.event_type}",
                changes={"wait_deadline": now + step.timeout},
            )
        case registry.Complete():
            outcome = {name: facts.get(name) for name in step.outcome}
            return Decision(State.COMPLETED, Trigger.COMPLETE, progress, changes={"outcome": outcome})
        case registry.Fail():
            return Decision(
                State.FAILED,
                Trigger.FAIL,
                progress,
                reason_code=step.reason,
                changes={"outcome": {"reason": step.reason}},
            )
    return quarantine(progress, "unknown_step_kind", f"{type(step).__name__} has no interpreter")
