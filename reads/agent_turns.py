"""An agent run's turns as the task page shows them: who was asked, what it asked for, what became of it.

Each ``runtime.AgentTurn`` row is one model turn, its response sealed whole to the task. A page needs
only the shape of it (which tools, which call ids, or that the agent answered), so that is all this
read takes out of the envelope: the arguments stay in the checkpoint's facts (``<tool>#<call>.<arg>``)
and the agent's words in the seal. The rest comes from our own records, never from the transcript:
the turn's tokens and cost are its ``ModelUsage`` row (same task, same ``state_version``); an effect
call's fate is its ledger action (the newest for the call's step) or, before one exists, the approval
asked for it; an evidence call's is the transition that read the record.

Cost: nothing for a task type without an ``AgentRun``; otherwise at most four queries whatever the run's
length: the turns (capped, their usage joined as subqueries), the actions of their calls, the approvals
of their calls, and the agent's transitions after the first turn (capped).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import OuterRef, Q, Subquery

from approvals.models import ApprovalRequest, ApprovalStatus
from audit import sealing
from audit.models import TransitionEvent
from ledger.models import IN_DOUBT, SETTLED_FAILED, SETTLED_OK, Action, DispatchState
from runtime.models import AgentTurn, ModelUsage
from tasks import registry
from tasks.models import Task

TURN_CODES = ("agent_turn", "agent_handoff")  # the transition that committed a turn
CALL_CODES = ("agent_evidence",)  # the transition that performed an evidence call
END_CODES = ("agent_finished",)


@dataclass(frozen=True)
class ToolCall:
    """One function call a turn asked for, and what our records say became of it."""

    tool: str
    call_id: str
    step: str  # ``<tool>#<call>``: the call's own step (and its action's)
    kind: str  # "effect", "evidence", or "undeclared" (the task type does not declare the tool)
    fate: str  # in words
    tone: str  # a state class for the page: completed, failed, outcome_unknown, waiting_approval, ready
    action: Action | None = None
    approval: ApprovalRequest | None = None
    event: TransitionEvent | None = None  # the evidence read


@dataclass(frozen=True)
class Turn:
    """One model turn of an agent run."""

    step: str  # the AgentRun step
    turn: int
    agent: str
    model_id: str
    state_version: int  # the version it was decided from; its transition is the next one
    calls: tuple[ToolCall, ...]
    answered: bool  # the agent answered (no call): the run's final word, kept as its output fact
    readable: bool  # the sealed response could be opened (a retired key or an erased turn cannot)
    input_tokens: int | None
    output_tokens: int | None
    cost: Decimal | None  # None: unpriced, or no usage recorded
    event: TransitionEvent | None  # the transition that recorded it


@dataclass(frozen=True)
class AgentTurns:
    turns: tuple[Turn, ...]  # oldest first, at most the cap
    more: bool  # the run has turns beyond the cap
    finished: TransitionEvent | None  # the transition that took the agent's answer, when shown


NONE = AgentTurns((), False, None)


def read_agent_turns(task: Task, cap: int | None) -> AgentTurns:
    """The turns of ``task``'s agent runs, oldest first, at most ``cap`` (``None``: every one; 0: none)."""
    kind = registry.get(task.task_type) if task.task_type in registry.names() else None
    if cap == 0 or kind is None or not kind.agent_runs:
        return NONE
    usage = ModelUsage.objects.filter(task=OuterRef("task"), state_version=OuterRef("state_version"))
    rows = AgentTurn.objects.filter(task=task).order_by("state_version", "id")
    rows = rows.annotate(
        used_in=Subquery(usage.values("input_tokens")[:1]),
        used_out=Subquery(usage.values("output_tokens")[:1]),
        used_cost=Subquery(usage.values("cost")[:1]),
    )
    found = list(rows if cap is None else rows[: cap + 1])
    more = cap is not None and len(found) > cap
    found = found[:cap] if cap is not None else found
    if not found:
        return NONE
    shapes = {row.id: _shape(row) for row in found}
    bases = {
        f"{name}{registry.CALL_MARK}{registry.call_key(call_id)}"
        for shape in shapes.values()
        if shape is not None
        for name, call_id in shape[0]
    }
    actions: dict[str, Action] = {}
    approvals: dict[str, ApprovalRequest] = {}
    if bases:
        for action in Action.objects.filter(task=task, step__in=sorted(bases)).order_by("id"):
            actions[action.step] = action  # the newest per step wins, as the run is told
        asked = ApprovalRequest.objects.filter(
            task=task, step__in=sorted(f"{base}{registry.APPROVE_SUFFIX}" for base in bases)
        )
        for request in asked.order_by("created_at"):
            approvals[request.action_step] = request
    # A turn's transition is the one after the version it was decided from, whatever its code: a turn
    # commits alone (``agent_turn``) or with what it led to (its evidence read, its call's intent, the
    # answer: ``runtime.sdk.step``).
    events = list(
        TransitionEvent.objects.filter(
            Q(reason_code__in=(*TURN_CODES, *CALL_CODES, *END_CODES))
            | Q(state_version__in=[row.state_version + 1 for row in found]),
            task=task,
            state_version__gt=found[0].state_version,
        ).order_by("state_version")[: 3 * len(found) + 1]
    )
    by_version = {event.state_version: event for event in events}
    turns = []
    for index, row in enumerate(found):
        shape = shapes[row.id]
        committed = by_version.get(row.state_version + 1)
        until = found[index + 1].state_version + 1 if index + 1 < len(found) else None
        read = [
            e
            for e in events
            if e.reason_code in CALL_CODES
            and e.state_version > row.state_version
            and (until is None or e.state_version < until)
        ]
        step = kind.step(row.step)
        calls = tuple(
            _call(step, name, call_id, actions, approvals, read)
            for name, call_id in (shape[0] if shape else ())
        )
        turns.append(
            Turn(
                step=row.step,
                turn=row.turn,
                agent=row.agent,
                model_id=row.model_id,
                state_version=row.state_version,
                calls=calls,
                answered=shape is not None and shape[1],
                readable=shape is not None,
                input_tokens=row.used_in,
                output_tokens=row.used_out,
                cost=row.used_cost,
                event=committed,
            )
        )
    ended = next((e for e in events if e.reason_code in END_CODES), None)
    return AgentTurns(tuple(turns), more, None if more else ended)


def _shape(row: AgentTurn) -> tuple[tuple[tuple[str, str], ...], bool] | None:
    """The (tool, call id) pairs the turn asked for, and whether it answered; None when unopenable.

    Only these two keys of each item are taken: the arguments and the words stay sealed."""
    try:
        opened = sealing.open_envelope(
            row.response, sealing.task_place(row.task_id, "agent_turns", row.step, row.turn)
        )
    except sealing.Unopenable:
        return None
    items = opened.get("items") if isinstance(opened, dict) else None
    if not isinstance(items, list):
        return None
    calls = tuple(
        (str(item.get("name", "")), str(item.get("call_id", "")))
        for item in items
        if isinstance(item, dict) and item.get("type") == "function_call"
    )
    return calls, not calls


def _call(
    step: registry.Step | None,
    tool: str,
    call_id: str,
    actions: dict[str, Action],
    approvals: dict[str, ApprovalRequest],
    read: Iterable[TransitionEvent],
) -> ToolCall:
    base = f"{tool}{registry.CALL_MARK}{registry.call_key(call_id)}"
    declared = step.tool(tool) if isinstance(step, registry.AgentRun) else None
    if isinstance(declared, registry.AgentEvidence):
        # The turn's evidence reads are its transitions coded agent_evidence, each naming its tool.
        found = next(((e, said) for e in read if (said := _read_of(e.reason, tool)) is not None), None)
        if found is None:
            return ToolCall(tool, call_id, base, "evidence", "not read yet", "ready")
        return ToolCall(tool, call_id, base, "evidence", found[1], "completed", event=found[0])
    if not isinstance(declared, registry.AgentEffect):
        return ToolCall(tool, call_id, base, "undeclared", "refused: not declared to the ledger", "failed")
    action, approval = actions.get(base), approvals.get(base)
    if action is not None:
        return ToolCall(
            tool, call_id, base, "effect", *_action_fate(action), action=action, approval=approval
        )
    if approval is not None:
        fate, tone = {
            ApprovalStatus.PENDING: ("waiting for an approver", "waiting_approval"),
            ApprovalStatus.REJECTED: ("rejected by an approver: not performed", "failed"),
            ApprovalStatus.APPROVED: ("approved; not sent yet", "ready"),
        }.get(ApprovalStatus(approval.status), (f"approval {approval.status}: not performed", "failed"))
        return ToolCall(tool, call_id, base, "effect", fate, tone, approval=approval)
    return ToolCall(tool, call_id, base, "effect", "not performed yet", "ready")


def _read_of(reason: str, tool: str) -> str | None:
    """What an evidence read's reason says of ``tool``: the reason itself when it names the tool first,
    or its part after the turn it committed with ("turn 1: … asks for lookup_order; lookup_order read
    …"); None when it is not ``tool``'s read."""
    for named in (f"{tool} ", f"{tool}:"):
        if reason.startswith(named):
            return reason
        at = reason.find(f"; {named}")
        if at >= 0:
            return reason[at + 2 :]
    return None


def _action_fate(action: Action) -> tuple[str, str]:
    state = DispatchState(action.dispatch_state)
    if state in SETTLED_OK:
        ref = f" · {action.external_ref}" if action.external_ref else ""
        return f"{state.value}{ref}", "completed"
    if state in SETTLED_FAILED:
        return f"{state.value}: {action.last_error or 'refused'}", "failed"
    if state in IN_DOUBT:
        return f"{state.value}: reconciled before anything is sent again", "outcome_unknown"
    return f"{state.value}: not sent yet", "ready"
