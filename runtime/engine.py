"""The agent step: from a task and its checkpoint, decide the next transition.

``decide`` does the step's bounded work — read evidence, ask the model, and
for a dispatch step claim and send an intent already committed (through the
ledger, which records the answer) — and returns a ``Decision``; it never
writes task state. The runner commits the decision through ``advance`` at the
version it was computed from, so a decision made from an old version is
discarded, never applied over newer state.
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.conf import settings

from approvals import services as approvals
from approvals.models import ApprovalStatus
from audit.models import TransitionEvent
from ledger.models import IN_DOUBT, SENDABLE, SETTLED_FAILED, SETTLED_OK, Action
from runtime import db, dispatch, evidence, llm, reconcile, validation
from runtime.llm import Model, ModelUnavailable
from tasks import registry, sealing, services
from tasks.checkpoints import Checkpoint, EvidenceRef, Progress, ToolCallRecord, as_fact
from tasks.decisions import Decision, quarantine, retry_later
from tasks.exceptions import StaleVersion
from tasks.leases import Held
from tasks.models import ExternalEvent, Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent


def decide(
    task: Task, checkpoint: Checkpoint, *, model: Model, now: datetime, lease: Held | None = None
) -> Decision | None:
    """The next transition for ``task``, or None when nothing can be decided yet.

    ``lease`` is the worker's: a dispatch step sends only under it (fenced).
    """
    kind = registry.get(task.task_type)
    progress = checkpoint.progress
    if task.state == State.RESUME_VALIDATION:
        return validation.validate(task, checkpoint, kind, now)
    if task.state == State.CANCEL_REQUESTED:
        return _confirm_cancel(task, progress)
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
    return _run_step(task, kind, step, progress, model=model, now=now, lease=lease)


def _no_event_arrived(task_id, event_type: str) -> None:
    """Inside the commit that starts a wait: an event stored since we looked voids the decision.

    ``task_deliver_event`` stores an early event under the task's row lock, and
    this runs after our UPDATE took that lock, so one of the two always sees
    the other: the event is never left behind a wait that began after it came.
    """
    if ExternalEvent.objects.filter(task_id=task_id, event_type=event_type).exists():
        raise StaleVersion("an external event arrived while the wait was being decided")


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
    lease: Held | None = None,
) -> Decision | None:
    facts = dict(progress.facts)
    match step:
        case registry.ReadEvidence():
            record_id = str(facts.get(step.record_from, ""))
            try:
                record = evidence.fetch(step.system, record_id)
                accepted = evidence.facts_from(record, step.facts)
            except evidence.EvidenceUnstorable as exc:
                # Not a retry: the record says the same next time. Hold the task until it is fixed.
                return quarantine(progress, "evidence_unstorable", str(exc))
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
            facts.update(accepted)
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
                with db.released():  # no database session held through the model's turn
                    said = model.complete(prompt_id=step.prompt_id, system=step.instructions, facts=facts)
                reply = llm.accepted(said)
            except ModelUnavailable as exc:
                return retry_later(task, kind, progress, now, code="model_unavailable", reason=str(exc))
            except llm.ModelOutputInvalid as exc:
                return retry_later(task, kind, progress, now, code="model_output_invalid", reason=str(exc))
            answer = reply.text
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
                # Checked when it arrived (api.views.tasks), stored as jsonb since: as_fact cannot refuse it.
                try:
                    payload = services.event_payload(early)  # its sensitive values are stored sealed
                except sealing.Unopenable as exc:
                    return quarantine(progress, "event_undecryptable", str(exc))
                facts[step.fact] = as_fact(payload.get(step.value))
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
                also=(functools.partial(_no_event_arrived, task.id, step.event_type),),
            )
        case registry.RequestApproval():
            return _approval_gate(task, kind, step, progress, now)
        case registry.Dispatch():
            return _dispatch(task, kind, step, progress, facts, lease)
        case registry.Complete():
            outcome = services.seal_outcome(task, {name: facts.get(name) for name in step.outcome})
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


def _dispatch(
    task: Task,
    kind: registry.TaskType,
    step: registry.Dispatch,
    progress: Progress,
    facts: dict[str, Any],
    lease: Held | None,
) -> Decision | None:
    """One side effect: commit the intent, send it once, then record what the system said.

    Every branch is safe to reach again after a crash: the intent is found by
    its key, a sent action is never sent again while in doubt, and a settled
    one is only recorded. The send is fenced by ``lease`` (``LeaseLost`` when
    the task was taken over).
    """
    if any(call.step == step.name for call in progress.tool_calls):
        return _advance_to(progress, step.next, task)  # done before a refresh or replan brought us back
    if step.needs_approval(facts):  # always when it names one, or above the type's money thresholds
        # The approved action runs only as approved: recheck the binding right before the intent.
        approved = approvals.latest_request(task, step.approval)
        if approved is None or approved.status != ApprovalStatus.APPROVED:
            return _advance_to(progress, step.approval, task)
        verdict, why = approvals.gate(task, kind, approved, progress)
        if verdict != "proceed":
            return Decision(
                State.READY,
                Trigger.STEP,
                progress.model_copy(update={"step": step.approval}),
                reason=why,
                reason_code=f"approval_{verdict}",
            )
    compensated = None
    if step.compensates:
        compensated = Action.objects.filter(task=task, step=step.compensates).order_by("-id").first()
    intent = ActionIntent(
        step=step.name,
        connector=step.connector,
        effect=step.effect(facts),
        compensates=compensated.pk if compensated else None,
    )
    action = Action.objects.filter(task=task, step=step.name).order_by("-id").first()
    if action is None:
        # Checkpoint before dispatching: the intent commits with this transition.
        return Decision(
            State.READY,
            Trigger.STEP,
            progress.model_copy(update={"step": step.name}),
            reason=f"intends {step.connector}: {intent.effect.get('kind', step.name)}",
            actions=(intent,),
        )
    if action.idempotency_key != intent.idempotency_key(task.id) and action.dispatch_state not in SETTLED_OK:
        return quarantine(
            progress,
            "effect_changed_after_intent",
            f"{step.name}: the facts changed after {action.idempotency_key} was intended",
        )
    if action.dispatch_state in SENDABLE:
        if lease is None:
            raise ValueError("a side effect is sent only under a worker's lease")
        action = dispatch.claim_and_send(action.pk, lease=lease)
        if action.dispatch_state in SENDABLE:
            return None  # moved back and forth under us: look again on the next claim, never call it unknown
    if action.dispatch_state in SETTLED_OK:
        call = ToolCallRecord(
            action_id=str(action.pk),
            idempotency_key=action.idempotency_key,
            step=step.name,
            outcome=action.dispatch_state,
        )
        done = {**facts, step.output: action.external_ref} if step.output else facts
        return _advance_to(
            progress,
            step.next,
            task,
            facts=done,
            tool_calls=[*progress.tool_calls, call],
            output_refs=[*progress.output_refs, f"{step.connector}:{action.external_ref}"],
        )
    if action.dispatch_state in SETTLED_FAILED:
        if step.on_rejected:
            return _advance_to(
                progress, step.on_rejected, task, facts={**facts, f"{step.name}_rejected": True}
            )
        return Decision(
            State.FAILED,
            Trigger.FAIL,
            progress,
            reason=action.last_error,
            reason_code="effect_rejected",
            changes={"outcome": {"reason": "effect_rejected", "action": action.idempotency_key}},
        )
    # In doubt: nothing is sent again until the reconciler has asked the system.
    return Decision(
        State.OUTCOME_UNKNOWN,
        Trigger.DISPATCH_UNKNOWN,
        progress.model_copy(update={"step": step.name}),
        reason=action.last_error or f"{action.idempotency_key} is {action.dispatch_state}",
        reason_code="dispatch_unknown",
    )


def _confirm_cancel(task: Task, progress: Progress) -> Decision | None:
    """Cancel after settling every in-flight effect; report what stays done.

    Effects cannot be unsent: whatever the authoritative systems performed is
    listed in the outcome as not undone. If a system cannot say yet, decide
    nothing now (the sweep brings the task back).
    """
    for action in Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT):
        reconcile.reconcile_action(action)
    if Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT).exists():
        return None
    actions = list(Action.objects.filter(task=task).order_by("id"))
    undone = {
        a.compensation_of_id for a in actions if a.compensation_of_id and a.dispatch_state in SETTLED_OK
    }
    not_undone = [
        {
            "action": a.idempotency_key,
            "connector": a.connector,
            "external_ref": a.external_ref,
            "step": a.step,
        }
        for a in actions
        if a.dispatch_state in SETTLED_OK and a.compensation_of_id is None and a.pk not in undone
    ]
    # The request's scope (``cancel:<scope>``), from the event that made it: an escalation
    # while the cancel waited rewrites the task's state_reason, not what was asked.
    requested = (
        TransitionEvent.objects.filter(task=task, trigger=Trigger.CANCEL)
        .order_by("-state_version")
        .values_list("reason_code", flat=True)
        .first()
    ) or task.state_reason
    return Decision(
        State.CANCELED,
        Trigger.CANCEL_CONFIRMED,
        progress,
        reason_code=requested,
        changes={"outcome": {"canceled": requested, "effects_not_undone": not_undone}},
    )


def _approval_gate(
    task: Task, kind: registry.TaskType, step: registry.RequestApproval, progress: Progress, now: datetime
) -> Decision:
    """Go on under a still-valid approval; otherwise ask (again), or refresh the evidence first."""
    request = approvals.latest_request(task, step.name)
    if request is not None and request.status == ApprovalStatus.REJECTED:
        return _advance_to(progress, step.on_rejected, task)
    if request is not None and request.status == ApprovalStatus.APPROVED:
        verdict, why = approvals.gate(task, kind, request, progress)
        if verdict == "proceed":
            return _advance_to(progress, step.next, task)
        if verdict == "refresh":
            return Decision(
                State.READY,
                Trigger.STEP,
                progress.model_copy(update={"step": kind.replan_step}),
                reason=why,
                reason_code="approval_needs_fresh_evidence",
            )
        return approvals.request_decision(task, kind, step, progress, now=now, why=f"re-approval: {why}")
    return approvals.request_decision(task, kind, step, progress, now=now)
