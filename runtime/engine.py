"""The agent step: from a task and its checkpoint, decide the next transition.

``decide`` does the step's bounded work — read evidence, ask the model, and
for a dispatch step claim and send an intent already committed (through the
ledger, which records the answer) — and returns a ``Decision``; it never
writes task state. The runner commits the decision through ``advance`` at the
version it was computed from, so a decision made from an old version is
discarded, never applied over newer state.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from approvals import authority
from approvals import services as approvals
from approvals.models import ApprovalStatus
from audit import sealing
from audit.models import TransitionEvent
from ledger import integrity, money, orphans
from ledger.models import IN_DOUBT, SENDABLE, SETTLED_FAILED, SETTLED_OK, Action, DispatchState
from ledger.services import action_move
from runtime import alerts, db, dispatch, evidence, llm, reconcile, usage, validation
from runtime.llm import Model, ModelUnavailable
from runtime.models import AlertKind
from tasks import cancellation, children, compensation, effect_keys, registry, services
from tasks.checkpoints import Checkpoint, EvidenceRef, Progress, ToolCallRecord, as_fact
from tasks.decisions import Decision, quarantine, retry_later
from tasks.exceptions import StaleVersion
from tasks.leases import Held
from tasks.models import CancelRequest, CancelScope, ExternalEvent, Task
from tasks.states import TERMINAL, State, Trigger
from tasks.transitions import ActionIntent


def decide(
    task: Task,
    checkpoint: Checkpoint,
    *,
    model: Model,
    now: datetime,
    lease: Held | None = None,
    cancels: Mapping[str, CancelRequest] | None = None,
) -> Decision | None:
    """The next transition for ``task``, or None when nothing can be decided yet.

    ``lease`` is the worker's: a dispatch step sends only under it (fenced).
    ``cancels``: the task's open cancel requests by scope (``tasks.cancellation``),
    as the worker read them before this step.
    Raises ``llm.TurnCanceled`` when a cancel request interrupted the model turn:
    the worker reads the task and its requests again, and decides from those.
    """
    kind = registry.get(task.task_type)
    progress = checkpoint.progress
    cancels = cancels or {}
    if task.state == State.RESUME_VALIDATION:
        return _noting_migration(validation.validate(task, checkpoint, kind, now), checkpoint)
    if task.state == State.CANCEL_REQUESTED:
        return _confirm_cancel(task, kind, progress)
    if task.deadline is not None and now >= task.deadline and not _in_doubt(task):
        return Decision(
            State.EXPIRED,
            Trigger.DEADLINE_PASSED,
            progress,
            reason="the task's deadline passed while it ran",
            reason_code="deadline_passed",
            changes={"outcome": {"reason": "deadline_passed"}},
        )
    if checkpoint.deployment != settings.DEPLOYMENT_ID or checkpoint.migrated_from is not None:
        written_by = checkpoint.deployment or "an unrecorded deployment"
        if checkpoint.migrated_from is not None:  # an older schema: the event says so; revalidate first
            return Decision(
                State.RESUME_VALIDATION,
                Trigger.DEPLOYMENT_CHANGED,
                progress,  # written back at the current schema
                reason_code="checkpoint_migrated",
                reason=f"{_migration(checkpoint)}, written by {written_by}",
            )
        return Decision(
            State.RESUME_VALIDATION,
            Trigger.DEPLOYMENT_CHANGED,
            progress,
            reason_code="deployment_changed",
            reason=f"checkpoint written by {written_by}, resuming on {settings.DEPLOYMENT_ID}",
        )
    undoing = Action.objects.filter(pk=task.compensates_id).first() if task.compensates_id else None
    if undoing is not None:
        ended = _compensation_run(task, kind, progress, undoing)
        if ended is not None:
            return ended
    step = kind.step(checkpoint.step)
    if step is None:
        return validation.unknown_step(kind, checkpoint.step, progress)
    verdict = _run_step(task, kind, step, progress, model=model, now=now, lease=lease, cancels=cancels)
    if undoing is not None and verdict is not None and verdict.reason_code in RUN_REFUSALS:
        # A compensation run ends the same way however its one call was refused.
        refused = RUN_REFUSALS[verdict.reason_code]
        return dataclasses.replace(
            verdict, reason_code=refused, changes={"outcome": _run_refused(refused, undoing)}
        )
    return verdict


def _migration(checkpoint: Checkpoint) -> str:
    return (
        f"checkpoint schema {checkpoint.migrated_from} migrated to {checkpoint.schema_version}"
        f" (deployment {settings.DEPLOYMENT_ID})"
    )


def _noting_migration(verdict: Decision, checkpoint: Checkpoint) -> Decision:
    """A validation of a checkpoint migrated from an older schema records the migration: a verdict
    that found nothing else (``revalidated``) is ``checkpoint_migrated``; any other keeps its own
    code, and its reason names the migration too. (The usual way in, ``deployment_changed``'s
    edge from ``ready``, already wrote the migrated checkpoint.)"""
    if checkpoint.migrated_from is None:
        return verdict
    if verdict.reason_code == "revalidated":
        return dataclasses.replace(
            verdict, reason_code="checkpoint_migrated", reason=f"{_migration(checkpoint)}; {verdict.reason}"
        )
    return dataclasses.replace(verdict, reason=f"{verdict.reason}; {_migration(checkpoint)}")


RECONCILED_ABSENT = DispatchState.RECONCILED_ABSENT
# Reason code of the step done on a result the system answered a repeated key with (its first one).
EFFECT_DEDUPLICATED = "effect_deduplicated"


def _in_doubt(task: Task) -> bool:
    """An effect of the task may or may not have happened: it is settled before the task may end."""
    return Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT).exists()


def _no_event_arrived(task_id: UUID, event_type: str) -> None:
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
    cancels: Mapping[str, CancelRequest],
) -> Decision | None:
    facts = dict(progress.facts)
    match step:
        case registry.ReadEvidence():
            record_id = str(facts.get(step.record_from, ""))
            try:
                record = evidence.fetch(step.system, record_id, tenant=task.tenant.slug)
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
            turn_cancel = cancels.get(CancelScope.MODEL_TURN)
            if turn_cancel is not None:
                return _turn_canceled(task, kind, step, progress, now, turn_cancel)
            timeout = step.timeout.total_seconds() if step.timeout is not None else None
            said: llm.Reply | None = None
            try:
                with db.released(), llm.limits(timeout):  # no database session held through the turn
                    said = model.complete(prompt_id=step.prompt_id, system=step.instructions, facts=facts)
                reply = llm.accepted(said)
            except llm.ModelTimedOut as exc:
                return retry_later(
                    task,
                    kind,
                    progress,
                    now,
                    code="step_timeout",
                    reason=str(exc),
                    trigger=Trigger.STEP_TIMED_OUT,
                )
            except ModelUnavailable as exc:
                return retry_later(task, kind, progress, now, code="model_unavailable", reason=str(exc))
            except llm.ModelOutputInvalid as exc:
                retry = retry_later(task, kind, progress, now, code="model_output_invalid", reason=str(exc))
                if said is None or not usage.reported(said):
                    return retry
                # Billed though refused: recorded under the model asked (the id it reported may be
                # what was refused), not committed.
                billed = dataclasses.replace(said, model_id=model.model_id)
                return _with_usage(retry, usage.recorder(task, step.name, billed, committed=False, now=now))
            answer = reply.text
            facts[step.output] = answer
            facts[f"{step.output}_model"] = reply.model_id  # which model produced this advisory answer
            advanced = _advance_to(progress, step.routes.get(answer) or step.next, task, facts=facts)
            return _with_usage(advanced, usage.recorder(task, step.name, reply, committed=True, now=now))
        case registry.AgentRun():
            turn_cancel = cancels.get(CancelScope.MODEL_TURN)
            if turn_cancel is not None:
                return _turn_canceled(task, kind, step, progress, now, turn_cancel)
            return _agent_step(task, kind, step, progress, now, lease)
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
            call_cancel = cancels.get(CancelScope.TOOL_CALL)
            if call_cancel is not None:
                withdrawn = _withdraw_call(task, step, progress, call_cancel)
                if withdrawn is not None:
                    return withdrawn
            return _dispatch(task, kind, step, progress, facts, lease, now)
        case registry.StartChildren():
            return _start_children(task, step, progress, facts, now)
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


def _agent_step(
    task: Task,
    kind: registry.TaskType,
    step: registry.AgentRun,
    progress: Progress,
    now: datetime,
    lease: Held | None,
) -> Decision:
    """An SDK agent's step (``runtime.sdk.step``), when this deployment has the SDK (the ``agents``
    extra); without it the task is held with the reason, not failed: a worker that has it resumes it."""
    try:
        from runtime.sdk import step as agent_step
    except ImportError as exc:
        return quarantine(progress, "agents_sdk_missing", f"this worker cannot run SDK agents: {exc}")

    def perform(call: registry.Dispatch, moved: Progress) -> Decision | None:
        return _dispatch(task, kind, call, moved, dict(moved.facts), lease, now)

    return agent_step.decide(task, kind, step, progress, now=now, perform=perform)


def _run_cannot_go_on(
    task: Task, kind: registry.TaskType, step: registry.Dispatch, progress: Progress
) -> Decision | None:
    """Hold an SDK agent's call before its intent when the run it belongs to could not resume after
    it (``runtime.sdk.step.refused_run``: its stored run state altered, or of a newer SDK schema):
    an approved refund must not be paid for a run that is then refused. None for any other step."""
    if not step.binds:
        return None
    try:
        from runtime.sdk import step as agent_step
    except ImportError as exc:
        return quarantine(progress, "agents_sdk_missing", f"this worker cannot run SDK agents: {exc}")
    return agent_step.refused_run(task, kind, step.name, progress)


def _with_usage(decision: Decision, write: Callable[[], None]) -> Decision:
    """``decision`` recording a turn's usage in its transaction (``runtime.usage``)."""
    return dataclasses.replace(decision, also=(*decision.also, write))


def _dispatch(
    task: Task,
    kind: registry.TaskType,
    step: registry.Dispatch,
    progress: Progress,
    facts: dict[str, Any],
    lease: Held | None,
    now: datetime | None = None,
) -> Decision | None:
    """One side effect: commit the intent, send it once, then record what the system said.

    Every branch is safe to reach again after a crash: the intent is found by
    its key, a sent action is never sent again while in doubt, and a settled
    one is only recorded. The send is fenced by ``lease`` (``LeaseLost`` when
    the task was taken over).

    Before the intent: a rerun reuses the same effect its original completed
    (``effect_reused``, nothing sent); the step's money policy may refuse it
    (``duplicate_reference``, the task fails) or send it to its approval; an
    approval asked before another task paid the same reference is asked again.
    The intent's commit checks the policy once more (``StaleVersion`` when it moved).
    """
    if any(call.step == step.name for call in progress.tool_calls):
        return _advance_to(progress, step.next, task)  # done before a refresh or replan brought us back
    effect = step.effect(facts)
    action = Action.objects.filter(task=task, step=step.name).order_by("-id").first()
    review = None
    if action is None:  # the money policy and a rerun's earlier effects are weighed before the intent only
        held = _run_cannot_go_on(task, kind, step, progress)
        if held is not None:
            return held
        reused = _reuse_earlier(task, step, progress, facts, effect)
        if reused is not None:
            return reused
        review = approvals.money_review(task, step, facts)
        if review is not None and review.refused is not None:
            return Decision(
                State.FAILED,
                Trigger.FAIL,
                progress,
                reason=review.refused.why,
                reason_code="duplicate_reference",
                changes={"outcome": {"reason": "duplicate_reference", "step": step.name}},
            )
    approved, approved_at = None, None
    if _needs_approval(task, step, action, review):
        # The approved action runs only as approved: recheck the binding right before the intent.
        approved = approvals.latest_request(task, step.approval)
        if approved is None or approved.status != ApprovalStatus.APPROVED:
            return _advance_to(progress, step.approval, task)
        verdict, why = approvals.gate(task, kind, approved, progress)
        if verdict == integrity.EFFECT_DIGEST_MISMATCH:
            return _not_as_intended(task, progress, why)
        if verdict != "proceed":
            return Decision(
                State.READY,
                Trigger.STEP,
                progress.model_copy(update={"step": step.approval}),
                reason=why,
                reason_code=f"approval_{verdict}",
            )
        approved_at = approved.created_at
        late = money.unseen(review, approved_at) if review is not None else []
        if late:  # paid by another task since the approver looked: they have not consented to paying again
            ask = kind.step_as(step.approval, registry.RequestApproval)
            made = "; ".join(money.describe(m) for m in late)
            return approvals.request_decision(
                task,
                kind,
                ask,
                progress,
                now=now or timezone.now(),
                why=f"re-approval: made since it was asked: {made}",
            )
    compensated = None
    if step.compensates and task.compensates_id:  # a compensation run: its canceled task's action
        compensated = Action.objects.filter(pk=task.compensates_id).first()
    elif step.compensates:
        compensated = Action.objects.filter(task=task, step=step.compensates).order_by("-id").first()
    intent = ActionIntent(
        step=step.name,
        connector=step.connector,
        effect=effect,
        compensates=compensated.pk if compensated else None,
    )
    if action is None:
        # Checkpoint before dispatching: the intent commits with this transition, and with it what
        # the money policy counts (its movement), checked once more under locks in the same commit.
        records: tuple[Any, ...] = ()
        also: tuple[Any, ...] = ()
        if step.money is not None:
            who = money.spender(task, step.name)
            key = intent.idempotency_key(effect_keys.scope_of(task))  # the key _ledger_rows writes
            records = (money.movement(step.money, facts, who, idempotency_key=key, now=timezone.now()),)
            check = money.guard(step.money, facts, who, approved_at=approved_at)
            also = (functools.partial(_money_still_passes, check),)
        return Decision(
            State.READY,
            Trigger.STEP,
            progress.model_copy(update={"step": step.name}),
            reason=f"intends {step.connector}: {intent.effect.get('kind', step.name)}",
            actions=(intent,),
            records=records,
            also=also,
        )
    expected = intent.idempotency_key(effect_keys.scope_of(task, action.key_scheme))  # in the action's scheme
    if action.idempotency_key != expected and action.dispatch_state not in SETTLED_OK:
        return quarantine(
            progress,
            "effect_changed_after_intent",
            f"{step.name}: the facts changed after {action.idempotency_key} was intended",
        )
    if action.dispatch_state in SENDABLE:
        if lease is None:
            raise ValueError("a side effect is sent only under a worker's lease")
        try:
            action = dispatch.claim_and_send(
                action.pk, lease=lease, at_version=task.state_version, approval=approved
            )
        except dispatch.EffectMismatch as exc:  # withheld unsent
            return _not_as_intended(task, progress, str(exc), code=exc.code)
        if action.dispatch_state in SENDABLE:
            return None  # moved back and forth under us: look again on the next claim, never call it unknown
    if integrity.is_withheld(action.outcome):  # withheld before (a release): held again, never sent
        unbound = action.last_error.startswith(f"{registry.ARGUMENT_UNBOUND}:")
        code = registry.ARGUMENT_UNBOUND if unbound else integrity.EFFECT_DIGEST_MISMATCH
        return _not_as_intended(task, progress, action.last_error, code=code)
    if action.dispatch_state in SETTLED_OK:
        settled = _done_with(action, task, step, progress, facts)
        if not action.duplicates_suppressed:
            return settled
        # The system had this key already (e.g. a task re-created with its client's key after a restore):
        # the chain says the step is done on the system's first result, not on a new effect.
        return dataclasses.replace(
            settled,
            reason=(
                f"{step.name}: {step.connector} answered {action.idempotency_key} with the result it"
                f" recorded first (external ref {action.external_ref or 'none'}): performed once, not again"
            ),
            reason_code=EFFECT_DEDUPLICATED,
            # An orphan `recover` found under this key is explained now: settled in this step's commit.
            also=(
                *settled.also,
                functools.partial(orphans.settle, action.connector, action.idempotency_key, task.id),
            ),
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


def _done_with(
    action: Action, task: Task, step: registry.Dispatch, progress: Progress, facts: dict[str, Any]
) -> Decision:
    """``step`` done with ``action``'s settled outcome (this task's, or an original's it reuses): the
    call recorded among the tool calls, the system's reference as the step's output."""
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


def _not_as_intended(
    task: Task, progress: Progress, why: str, *, code: str = integrity.EFFECT_DIGEST_MISMATCH
) -> Decision:
    """Hold the task: what it was about to send (or an approval's copy of it) is not what was committed
    (``code``: ``effect_digest_mismatch``), or an agent's call is not what its evidence vouches for
    (``agent_argument_unbound``, ``runtime.dispatch``).

    Someone changed a row in the database. Nothing is sent, and an alert commits with the
    quarantine. A release comes back here (the action stays withheld): only a new task, started
    by an operator who checked the history, intends the effect again.
    """
    held = quarantine(progress, code, why)

    def raise_alert() -> None:
        alerts.raise_for(AlertKind.EFFECT_DIGEST_MISMATCH, task.id)

    return dataclasses.replace(held, also=(raise_alert,))


def _needs_approval(
    task: Task, step: registry.Dispatch, action: Action | None, review: money.Review | None
) -> bool:
    """Must an approval of ``step.approval`` cover this effect?

    Always when the step names one without a money policy (or with one that asks every time);
    with a policy, before the intent when the review found something. Once the intent exists,
    when one was asked for it: the intent's own commit checked the policy (``money.guard``), and
    a policy that moved since then does not un-send or re-ask for an effect already committed.
    """
    if not step.approval:
        return False
    if step.money is None or step.money.always:
        return True
    if action is None:
        return review is None or bool(review.findings)
    return approvals.latest_request(task, step.approval) is not None


def _money_still_passes(check: Any) -> None:
    """Inside the intent's commit: the money policy's second look, under its locks. Another effect
    committed since the review (a payment of the same invoice, a total now crossed) voids this
    decision; the next pass reviews again and asks for the approval it now needs."""
    try:
        check()
    except money.PolicyMoved as exc:
        raise StaleVersion(f"the money policy no longer lets this intent pass: {exc}") from None


def _reuse_earlier(
    task: Task, step: registry.Dispatch, progress: Progress, facts: dict[str, Any], effect: dict[str, Any]
) -> Decision | None:
    """A rerun reaching a dispatch its original (or a task up its ``rerun_of`` chain) completed —
    same step, same effect (``effect_digest``), settled ok and not undone — records that effect as
    done with the original's outcome and sends nothing (``effect_reused``). None: nothing to reuse.

    A compensation run is not a rerun of its task's effects (it undoes one of them): never here.
    An effect that differs is not reused; its business reference, if the type declares one, sends
    it through an approval showing the earlier effect (``ledger.money``).
    """
    if task.rerun_of_id is None or task.compensates_id is not None:
        return None
    # The tasks it runs again: the same lineage separation of duties reads (one walk, one definition).
    lineage = [earlier.pk for earlier in authority.lineage(task)[1:]]
    digest = ActionIntent(step=step.name, connector=step.connector, effect=effect).digest
    earlier = (
        Action.objects.filter(
            task_id__in=lineage,
            step=step.name,
            connector=step.connector,
            effect_digest=digest,
            dispatch_state__in=SETTLED_OK,
            compensation_of__isnull=True,
        )
        .exclude(compensations__dispatch_state__in=SETTLED_OK)
        .order_by("id")
        .first()
    )
    if earlier is None:
        return None
    verdict = _done_with(earlier, task, step, progress, facts)
    return dataclasses.replace(
        verdict,
        reason=(
            f"{step.name}: reused the outcome of {earlier.idempotency_key} ({earlier.dispatch_state},"
            f" external ref {earlier.external_ref or 'none'}) from task {earlier.task_id}, which this task"
            " reruns: nothing sent"
        ),
        reason_code="effect_reused",
    )


def _turn_canceled(
    task: Task,
    kind: registry.TaskType,
    step: registry.ModelTurn | registry.AgentRun,
    progress: Progress,
    now: datetime,
    request: CancelRequest,
) -> Decision:
    """An operator canceled the model turn: not a failure (the attempt count stays); asked again later."""
    return Decision(
        State.WAITING_RETRY,
        Trigger.TURN_CANCELED,
        progress.model_copy(update={"step": step.name}),
        reason=f"model turn at {step.name} canceled: {request.reason}",
        reason_code=f"cancel:{CancelScope.MODEL_TURN}",
        changes={"wait_deadline": now + kind.backoff_for(max(task.attempt, 1))},
        also=(
            functools.partial(
                cancellation.resolve,
                [request],
                applied=True,
                note=f"the turn at {step.name} was stopped; it runs again after the backoff",
            ),
        ),
    )


def _withdraw_call(
    task: Task, step: registry.Dispatch, progress: Progress, request: CancelRequest
) -> Decision | None:
    """Apply a ``tool_call`` cancel to this dispatch step; None when the call goes on as usual.

    Not yet sent (no intent, or an intent never claimed): withdrawn in the same
    commit as the task's move, so it is never sent. Already sent: it cannot be
    unsent; the request is closed saying so, and the call's outcome is settled
    as any other (reconciled when in doubt).
    """
    if any(call.step == step.name for call in progress.tool_calls):
        return None  # this call is done; the request waits for the next one
    action = Action.objects.filter(task=task, step=step.name).order_by("-id").first()
    if action is not None and action.dispatch_state not in SENDABLE:
        cancellation.resolve(
            [request],
            applied=False,
            note=f"{action.idempotency_key} was already sent ({action.dispatch_state}); it cannot be unsent "
            "and is settled with the system as usual",
        )
        return None
    writes: list[Any] = [
        functools.partial(
            cancellation.resolve,
            [request],
            applied=True,
            note=f"the call at {step.name} was withdrawn unsent",
        )
    ]
    if action is not None:
        writes.append(functools.partial(_withdraw, action))
    reason = f"tool call at {step.name} canceled before it was sent: {request.reason}"
    if step.on_rejected:
        return Decision(
            State.READY,
            Trigger.STEP,
            progress.model_copy(
                update={"step": step.on_rejected, "facts": {**progress.facts, f"{step.name}_canceled": True}}
            ),
            reason=reason,
            reason_code=f"cancel:{CancelScope.TOOL_CALL}",
            also=tuple(writes),
        )
    return Decision(
        State.FAILED,
        Trigger.FAIL,
        progress.model_copy(update={"step": step.name}),
        reason=reason,
        reason_code="tool_call_canceled",
        changes={"outcome": {"reason": "tool_call_canceled", "step": step.name}},
        also=tuple(writes),
    )


def _withdraw(action: Action, why: str = "withdrawn: canceled before it was sent") -> None:
    """Mark a never-sent intent as definitely not performed; raises ``StaleVersion`` if it moved meanwhile."""
    target = (
        DispatchState.FAILED
        if action.dispatch_state == DispatchState.INTENDED
        else DispatchState.RECONCILED_FAILED
    )
    if not action_move(action.pk, action.dispatch_state, target, last_error=why):
        raise StaleVersion(f"{action.idempotency_key} moved while it was being withdrawn")


def _start_children(
    task: Task, step: registry.StartChildren, progress: Progress, facts: dict[str, Any], now: datetime
) -> Decision:
    """Start the step's children and wait for them; once all ended, go on by how they ended."""
    started = children.of_step(task, step.name)
    waiting = progress.model_copy(update={"step": step.name})
    if not started:
        specs = step.children(facts)
        if specs:
            return Decision(
                State.WAITING_CHILDREN,
                Trigger.AWAIT_CHILDREN,
                waiting,
                reason=f"started {len(specs)} child task(s)",
                changes={"wait_deadline": now + step.timeout},
                also=(functools.partial(children.start, task, step.name, specs, actor=children.WAKER),),
            )
    running = [child for child in started if child.state not in TERMINAL]
    if running:
        return Decision(
            State.WAITING_CHILDREN,
            Trigger.AWAIT_CHILDREN,
            waiting,
            reason=f"{len(running)} of {len(started)} child task(s) still running",
            changes={"wait_deadline": now + step.timeout},
            also=(functools.partial(children.none_running_guard, task),),
        )
    counts = children.tally(started)
    completed = counts.get(State.COMPLETED, 0)
    incomplete = len(started) - completed
    ended = {**facts, f"{step.output}_completed": completed, f"{step.output}_not_completed": incomplete}
    if not incomplete:
        return _advance_to(progress, step.next, task, facts=ended)
    summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    if step.on_incomplete:
        return _advance_to(progress, step.on_incomplete, task, facts=ended)
    return Decision(
        State.FAILED,
        Trigger.FAIL,
        progress.model_copy(update={"facts": ended}),
        reason=f"children ended: {summary}",
        reason_code="children_incomplete",
        changes={"outcome": {"reason": "children_incomplete", "children": dict(sorted(counts.items()))}},
    )


def _confirm_cancel(task: Task, kind: registry.TaskType, progress: Progress) -> Decision | None:
    """Cancel once nothing runs on the task's behalf any more; report what stays done.

    In order: children still running are asked to cancel, and waited for (their
    ends ring this task); intents never sent are withdrawn, so they never will be;
    effects in doubt are settled with the authoritative systems. Effects cannot be
    unsent: whatever the systems performed is listed as not undone, each with the
    compensating step the task type offers for it, if any. Returns None (decide
    nothing now) while a child runs or a system cannot say yet.
    """
    if cancellation.running_children(task):
        cancellation.cancel_children(task, reason=f"parent task {task.id} is being canceled")
        if cancellation.running_children(task):
            return None
    for action in Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT):
        reconcile.reconcile_action(action)
    if Action.objects.filter(task=task, dispatch_state__in=IN_DOUBT).exists():
        return None
    actions = list(Action.objects.filter(task=task).order_by("id"))
    # Never sent: withdrawn in the cancel's own commit, so they never will be.
    unsent = [a for a in actions if a.dispatch_state == DispatchState.INTENDED]
    undone = {
        a.compensation_of_id for a in actions if a.compensation_of_id and a.dispatch_state in SETTLED_OK
    }
    offers = compensation.undo_steps(kind.name)
    not_undone = [
        {
            "action": a.idempotency_key,
            "connector": a.connector,
            "external_ref": a.external_ref,
            "step": a.step,
            "compensation": offers.get(a.step, ""),  # the step that would undo it, offered as a new action
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
    asked = cancellation.pending(task.id).get(CancelScope.TASK)
    report: dict[str, Any] = {
        "canceled": requested,
        "requested_by": asked.requested_by if asked else "",
        "effects_not_undone": not_undone,
        "withdrawn_unsent": [a.idempotency_key for a in unsent],
        # Sent, and found absent by a lookup made once they could no longer land: not sent again, and
        # still watched for a late landing (``runtime.reconcile``), which would amend this report.
        "found_absent": [a.idempotency_key for a in actions if a.dispatch_state == RECONCILED_ABSENT],
        "children": [{"task": str(child.id), "state": child.state} for child in task.children.order_by("id")],
    }
    withdraw = tuple(functools.partial(_withdraw, a, "withdrawn: the task was canceled") for a in unsent)
    return Decision(
        State.CANCELED,
        Trigger.CANCEL_CONFIRMED,
        progress,
        reason=(
            f"canceled ({asked.reason if asked and asked.reason else requested}): "
            f"{len(not_undone)} effect(s) left done, {len(unsent)} never sent and withdrawn"
        ),
        reason_code=requested,
        changes={"outcome": report},
        also=withdraw,
    )


# How a compensation run's one call can be refused, whichever way the type's steps go on from there.
RUN_REFUSALS = {
    "effect_rejected": "compensation_rejected",
    "tool_call_canceled": "compensation_canceled",
}


def _run_refused(code: str, undoing: Action) -> dict[str, Any]:
    return {"reason": code, "compensated": None, "undoes": undoing.idempotency_key}


def _compensation_run(
    task: Task, kind: registry.TaskType, progress: Progress, undoing: Action
) -> Decision | None:
    """A compensation run (``tasks.compensation``) does its one step, then ends; None: run that step.

    It ends ``completed`` once its effect settled, ``failed`` when the system or an
    approver refused it or its call was canceled. Wherever else the type's steps lead
    it (an approval's ``next``), it goes back to the compensating step.
    """
    name = compensation.undo_steps(kind.name).get(undoing.step, "")
    step = kind.step(name)
    if not isinstance(step, registry.Dispatch):
        return quarantine(
            progress, "compensation_step_missing", f"{kind.name} no longer undoes {undoing.step}"
        )
    done = next((call for call in progress.tool_calls if call.step == name), None)
    if done is not None:
        outcome = {
            "compensated": undoing.idempotency_key,
            "by": done.idempotency_key,
            "external_ref": progress.facts.get(step.output),
        }
        return Decision(
            State.COMPLETED,
            Trigger.COMPLETE,
            progress,
            reason=f"{name} undid {undoing.idempotency_key}",
            reason_code="compensated",
            changes={"outcome": outcome},
        )
    refused = ""
    if progress.facts.get(f"{name}_rejected"):
        refused = RUN_REFUSALS["effect_rejected"]
    elif progress.facts.get(f"{name}_canceled"):
        refused = RUN_REFUSALS["tool_call_canceled"]
    elif step.approval and progress.step not in (name, step.approval):
        request = approvals.latest_request(task, step.approval)
        refused = "compensation_not_approved" if request and request.status == ApprovalStatus.REJECTED else ""
    if refused:
        return Decision(
            State.FAILED,
            Trigger.FAIL,
            progress,
            reason=f"{name} did not undo {undoing.idempotency_key}",
            reason_code=refused,
            changes={"outcome": _run_refused(refused, undoing)},
        )
    if progress.step in (name, step.approval):
        return None
    return _advance_to(progress, name, task)


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
        if verdict == integrity.EFFECT_DIGEST_MISMATCH:  # the request was changed in the database
            return _not_as_intended(task, progress, why)
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
