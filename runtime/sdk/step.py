"""One step of an ``AgentRun``: read the run's records, replay it, commit the one new thing.

What each kind of progress becomes (``replay`` finds it):

- a new model turn: a transition of the run's step (``agent_turn``; ``agent_handoff`` when a handoff
  moved the run to another agent) committing its ``AgentTurn`` row and its usage;
- a call of an ``AgentEvidence`` tool: the record read now, its reference and facts kept, what the
  model is told kept as fact ``<tool>#<call>:output`` (``agent_evidence``);
- a call of an ``AgentEffect`` tool: its arguments become facts and the call's own ``Dispatch`` step
  decides at once (``agent_tool_call``: the intent, or the approval the policy asks for first); from
  there it sends once under the lease and is reconciled when in doubt: the engine's ordinary path,
  so everything that holds for a workflow's effect holds for the agent's;
- an SDK pause for approval: the run state stored (``snapshots``) and our approval asked, in one
  commit: the task is ``waiting_approval`` only once both are written;
- the final answer: fact ``output``, on to the step's ``next``.

A new turn commits with what it leads to when that needs no other model turn: its first call (the
evidence read, or the call's intent or approval), the pause for approval, or the answer. The step
replays the run once more over the records plus the uncommitted turn (``replay.run(ask=False)``),
decides as above, and commits both in one transition (``_together``). A turn that came with a handoff
commits alone (``agent_handoff``: it stays a transition of its own in the history); so does one whose
replay fails or would ask the model again (``agent_turn``), and the next step goes on from the records.

What the run is told of a call comes from our records, never from the snapshot: the ledger's
settled action (its reference, or why the system refused), the approver's rejection, the evidence
read. A snapshot that thinks a call has not run, where the ledger says it settled, is told the
ledger's answer.

The model's arguments are a request, not authority. Before a call becomes an intent, evidence or an
approval request:

- a call id the task's turns already used for another call (another tool or other arguments, or
  another id naming the same call step) quarantines the task (``CALL_ID_REUSED``): what the run was
  told under that id would be taken for this call's answer. Nothing of that turn is performed;
- arguments that are not a JSON object of storable values (not JSON, an array, NaN) refuse the call
  (``ARGUMENTS_MALFORMED``);
- arguments the task's evidence does not vouch for (``registry.EvidenceBinding``: an order this run
  did not look up, more than its total, another currency) refuse the call
  (``registry.ARGUMENT_UNBOUND``).

A refused call is not a quarantine: it is a transition with its reason code, and the model is told
``{"ok": false, "error": ...}`` as the call's output, so it may look the order up or ask again within
its turns, and nothing is sent. (Should an unbound intent reach the ledger by another path, the send
is withheld and the task quarantined: ``runtime.dispatch``.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import CharField, QuerySet, Value
from django.db.models.functions import JSONObject

from approvals import services as approvals
from approvals.models import ApprovalStatus
from audit import sealing
from audit.redaction import redact
from ledger.models import SETTLED_FAILED, SETTLED_OK, Action
from runtime import alerts, compiled, db, evidence, llm, usage
from runtime.models import AgentTurn, AlertKind
from runtime.sdk import replay, session, snapshots, toolsets
from tasks import registry, values
from tasks.checkpoints import EvidenceRef, Progress, as_fact
from tasks.decisions import Decision, quarantine, retry_later
from tasks.models import Task
from tasks.states import State, Trigger

# What the model is told of a call an approver refused (the decision's comment is theirs, not its).
REJECTED = "An approver rejected this call; it was not performed."

# Reason codes of what the model asked for and was refused (the module docstring); with
# ``registry.ARGUMENT_UNBOUND`` and ``snapshots``' codes, the adapter's own.
CALL_ID_REUSED = "agent_call_id_reused"
ARGUMENTS_MALFORMED = "agent_arguments_malformed"
READABLE_SCHEMAS = replay.READABLE_SCHEMAS


# The engine's own decision for a call's ``Dispatch`` step from the given progress (its intent, its
# approval, or None when nothing can be decided yet): how a call is performed, as a workflow's effect is.
Perform = Callable[[registry.Dispatch, Progress], Decision | None]


def decide(
    task: Task,
    kind: registry.TaskType,
    step: registry.AgentRun,
    progress: Progress,
    *,
    now: datetime,
    perform: Perform,
) -> Decision:
    facts = dict(progress.facts)
    turns, actions = _records(task, step)
    reused = _reused_call_id(turns)
    if reused:
        return quarantine(progress, CALL_ID_REUSED, reused)
    outputs, rejected = _call_results(task, turns, facts, actions, asked=bool(progress.approvals))
    start, start_turns = "", 0
    stored = snapshots.latest(task, step.name, facts)
    if stored is not None:
        try:
            start, start_turns = snapshots.opened(stored, readable=READABLE_SCHEMAS), stored.turns
        except snapshots.SnapshotRefused as exc:
            return _refused(task, progress, exc.code, str(exc))
    conversation = _conversation(task, step, facts)
    memory: list[dict[str, Any]] = []
    if conversation:
        # What the conversation held when the run began (its end then, a fact of the run's first
        # decision), so every replay starts from the same items however the conversation grew since.
        mark = facts.get(f"{step.name}:memory")
        try:
            if not isinstance(mark, int):
                mark = session.end(task.tenant_id, conversation)
                facts[f"{step.name}:memory"] = mark
                progress = progress.model_copy(update={"facts": facts})
            memory = _from_a_request(
                session.read(task.tenant_id, conversation, step.memory_items, before=mark)
            )
        except session.SessionItemUnreadable as exc:
            return quarantine(progress, "agent_memory_unreadable", str(exc))
    recorded = replay.Recorded(turns, outputs, rejected, start, start_turns, memory)
    started = time.monotonic()
    try:
        outcome = _replayed(kind, step, facts, recorded, ask=True)
    except replay.TurnInterrupted as exc:
        raise llm.TurnCanceled(str(exc)) from None
    except replay.TurnTimedOut as exc:
        return retry_later(
            task,
            kind,
            progress,
            _failed_at(now, started),
            code="step_timeout",
            reason=str(exc),
            trigger=Trigger.STEP_TIMED_OUT,
        )
    except replay.AgentFailed as exc:
        if exc.code == "agent_guardrail_tripped" or exc.code == "agent_max_turns":
            return Decision(
                State.FAILED,
                Trigger.FAIL,
                progress,
                reason=str(exc),
                reason_code=exc.code,
                changes={"outcome": {"reason": exc.code}},
            )
        return quarantine(progress, exc.code, str(exc))  # the agent and its declaration disagree
    except replay.RunStateUnusable as exc:
        return _refused(task, progress, snapshots.TAMPERED, str(exc))
    except Exception as exc:  # the model's failure (HTTP, 429, garbled body) or the SDK's on its reply
        said = str(exc) if isinstance(exc, replay.ModelCallFailed) else f"{type(exc).__name__}: {exc}"
        return retry_later(
            task, kind, progress, _failed_at(now, started), code="model_unavailable", reason=_said(said)
        )
    went_on = functools.partial(
        _went_on, task, kind, step, now=now, perform=perform, conversation=conversation
    )
    if not isinstance(outcome, replay.NewTurn):
        return went_on(outcome, progress, facts, turns)
    turned = _turn(task, step, progress, outcome, now, turns)
    if turned.reason_code != "agent_turn":  # a handoff is a transition of its own; a quarantine is final
        return turned
    # What the new turn leads to (a call, a pause, the answer) is decided now, from the records plus
    # this turn, and committed with it: one transition where two would do the same. The run replays
    # the turn without asking the model anything; what it cannot decide yet (another turn to ask, a
    # failure the next step meets again from the records) leaves the turn to commit alone.
    with_turn = {
        **turns,
        outcome.turn: {"items": outcome.items, "usage": outcome.usage, "agent": outcome.agent},
    }
    try:
        then = _replayed(kind, step, facts, dataclasses.replace(recorded, turns=with_turn), ask=False)
    except Exception:  # noqa: BLE001 - met again, and decided, by the step that replays the committed turn
        return turned
    if isinstance(then, replay.NewTurn | replay.Unasked):
        return turned
    assert turned.progress is not None
    return _together(turned, went_on(then, turned.progress, dict(turned.progress.facts), with_turn))


def _replayed(
    kind: registry.TaskType,
    step: registry.AgentRun,
    facts: dict[str, Any],
    recorded: replay.Recorded,
    *,
    ask: bool,
) -> replay.Outcome:
    """``replay.run`` of ``step`` over ``recorded``; with ``ask``, no database session held meanwhile
    (the model may be asked; a replay alone is over before a session would be worth giving back)."""
    with db.released() if ask else contextlib.nullcontext():
        return replay.run(
            step,
            _first_message(kind, step, facts),
            recorded,
            context=_shown(kind, step, facts),
            timeout=step.timeout.total_seconds() if step.timeout is not None else None,
            cancel=llm.cancel_signal.get(),
            ask=ask,
        )


def _went_on(
    task: Task,
    kind: registry.TaskType,
    step: registry.AgentRun,
    outcome: replay.Outcome,
    progress: Progress,
    facts: dict[str, Any],
    turns: dict[int, dict[str, Any]],
    *,
    now: datetime,
    perform: Perform,
    conversation: str,
) -> Decision:
    """The decision for where the run stopped short of a new turn: a call, a pause, or its answer."""
    match outcome:
        case replay.CallNeeded():
            return _call(task, kind, step, progress, facts, outcome.call, now, perform, turns)
        case replay.Paused():
            return _pause(task, kind, step, progress, facts, outcome, now, turns)
        case replay.Finished():
            done = {**facts, step.output: as_fact(outcome.output)}
            changes = {"attempt": 0} if task.attempt else {}
            # The run's items join its conversation in the commit that finishes the step: once.
            remember = (
                (functools.partial(session.append, task.tenant_id, conversation, outcome.said, task),)
                if conversation
                else ()
            )
            return Decision(
                State.READY,
                Trigger.STEP,
                progress.model_copy(update={"step": step.next, "facts": done}),
                reason=f"{outcome.agent} answered",
                reason_code="agent_finished",
                changes=changes,
                also=remember,
            )
    raise AssertionError(f"unhandled replay outcome {outcome!r}")


def _together(turned: Decision, then: Decision) -> Decision:
    """One transition committing a new turn (``turned``) and what it led to (``then``, decided from
    the turn's progress): ``then``'s, with the turn's rows and writes first and both reasons."""
    return dataclasses.replace(
        then,
        reason=f"{turned.reason}; {then.reason}" if then.reason else turned.reason,
        reason_code=then.reason_code or turned.reason_code,
        changes={**turned.changes, **then.changes},
        records=(*turned.records, *then.records),
        also=(*turned.also, *then.also),
    )


def _from_a_request(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` from its first user message on: a window cut in the middle of a run would start with
    a tool's output whose call it no longer holds, which a model refuses."""
    first = next((n for n, item in enumerate(items) if item.get("role") == "user"), len(items))
    return items[first:]


def _conversation(task: Task, step: registry.AgentRun, facts: dict[str, Any]) -> str:
    """The run's conversation id: a digest of its ``session`` fact's value in the task's tenant (the
    value itself, an address say, is not stored in clear); "" without memory or without the fact."""
    value = facts.get(step.session) if step.session else None
    if value in (None, ""):
        return ""
    named = f"{task.tenant_id}:{task.task_type}:{step.session}:{value}"
    return "conversation-" + hashlib.sha256(named.encode()).hexdigest()[:40]


def _failed_at(now: datetime, started: float) -> datetime:
    """When the model call failed, on the step's clock: a backoff counts from the failure, not from
    the step's start (a call that timed out after 30 s would otherwise owe no wait at all)."""
    return now + timedelta(seconds=time.monotonic() - started)


def _said(text: str) -> str:
    """What a failed call said, as an audit reason may keep it: bounded, storable, and redacted (an
    upstream's error body may quote the request's key or the customer's data back)."""
    return redact(values.printable(f"model call failed: {text}", limit=MAX_FAILURE_CHARS))


# A failure's message is kept to this many characters: an error page quoted whole says no more.
MAX_FAILURE_CHARS = 500


@dataclass(frozen=True)
class _Settled:
    """What the ledger holds of a call's action: its dispatch state, reference and last error."""

    state: str
    ref: str
    error: str


def _records(task: Task, step: registry.AgentRun) -> tuple[dict[int, dict[str, Any]], dict[str, _Settled]]:
    """The run's turns, opened, by number, and the ledger's newest action of each of the task's
    calls (``registry.CALL_MARK`` steps), by step: one round trip where it took two."""
    opened: dict[int, dict[str, Any]] = {}
    newest: dict[str, tuple[int, _Settled]] = {}
    for kind, number, name, value in compiled.rows("sdk_records", _records_query, task.pk, step.name):
        if kind == _TURN_ROW:
            opened[number] = {**_opened(task.id, step.name, number, value), "agent": name}
        elif isinstance(value, dict) and number > newest.get(name, (-1, None))[0]:  # the newest wins
            newest[name] = (number, _Settled(str(value["state"]), str(value["ref"]), str(value["error"])))
    return dict(sorted(opened.items())), {name: settled for name, (_, settled) in newest.items()}


_TURN_ROW, _ACTION_ROW = "turn", "action"


def _records_query(task_id: Any, step_name: str) -> QuerySet[Any]:
    """``_records``' one read: the step's turns, then the task's call actions (compiled once)."""
    turns = AgentTurn.objects.filter(task_id=task_id, step=step_name).values_list(
        Value(_TURN_ROW, output_field=CharField()), "turn", "agent", "response"
    )
    calls = Action.objects.filter(task_id=task_id, step__contains=registry.CALL_MARK).values_list(
        Value(_ACTION_ROW, output_field=CharField()),
        "id",
        "step",
        JSONObject(state="dispatch_state", ref="external_ref", error="last_error"),
    )
    return turns.union(calls, all=True)


def _opened(task_id: Any, step: str, turn: int, response: Any) -> dict[str, Any]:
    value = sealing.open_envelope(response, _turn_place(task_id, step, turn))
    return dict(value) if isinstance(value, dict) else {}


def _turn_place(task_id: Any, step: str, turn: int) -> tuple[str | int, ...]:
    return sealing.task_place(task_id, "agent_turns", step, turn)


def _first_message(kind: registry.TaskType, step: registry.AgentRun, facts: dict[str, Any]) -> str:
    return json.dumps(_shown(kind, step, facts), sort_keys=True, default=str)


def _shown(kind: registry.TaskType, step: registry.AgentRun, facts: dict[str, Any]) -> dict[str, Any]:
    """The brief's facts as the model may see them: sensitive ones masked unless ``model_sees``."""
    hidden = kind.sensitive - kind.model_sees
    return {
        name: sealing.MODEL_MASK if name in hidden and facts.get(name) not in (None, "") else facts.get(name)
        for name in step.brief
    }


def _call_results(
    task: Task,
    turns: dict[int, dict[str, Any]],
    facts: dict[str, Any],
    actions: dict[str, _Settled],
    *,
    asked: bool,
) -> tuple[dict[str, str], dict[str, str]]:
    """What the run is told of each call the recorded turns made: from the ledger, the approvals and
    the evidence facts. A call with no settled answer yet is in neither map (the run stops there).

    ``asked``: the checkpoint lists an approval request of the task. A request commits with the
    checkpoint that lists it (``approvals.request_decision``), so without one there is no request,
    hence no rejection, to read."""
    calls = [
        (str(item.get("call_id")), str(item.get("name")))
        for turn in turns.values()
        for item in turn.get("items", [])
        if item.get("type") == "function_call"
    ]
    outputs: dict[str, str] = {}
    rejected: dict[str, str] = {}
    bases = {registry.call_step(name, call_id): call_id for call_id, name in calls}
    for base, call_id in bases.items():
        read = facts.get(f"{base}:output")
        action = actions.get(base)
        if isinstance(read, str):
            outputs[call_id] = read
        elif action is not None and action.state in SETTLED_OK:
            outputs[call_id] = json.dumps({"ok": True, "reference": action.ref})
        elif action is not None and action.state in SETTLED_FAILED:
            outputs[call_id] = json.dumps({"ok": False, "error": action.error or "refused"})
        elif action is None and asked:
            request = approvals.latest_request(task, f"{base}{registry.APPROVE_SUFFIX}")
            if request is not None and request.status == ApprovalStatus.REJECTED:
                rejected[call_id] = REJECTED
    return outputs, rejected


def _reused_call_id(turns: dict[int, dict[str, Any]]) -> str:
    """Why the turns' calls are not one call per id ("" when they are): an id used again for another
    tool or other arguments, or two ids naming the same call step (``registry.call_key``). The same
    call repeated word for word is the same call: its recorded answer is the answer."""
    made: dict[str, tuple[str, str]] = {}
    keys: dict[str, str] = {}
    for number in sorted(turns):
        for item in turns[number].get("items", []):
            if item.get("type") != "function_call":
                continue
            call_id, call = str(item.get("call_id")), (str(item.get("name")), str(item.get("arguments")))
            shown = values.printable(call_id, values.MAX_QUOTED)
            if made.setdefault(call_id, call) != call:
                return (
                    f"turn {number} uses call id '{shown}' again, for {values.printable(call[0], 64)} with"
                    " other arguments than the call it named before: nothing of that turn is performed"
                )
            if keys.setdefault(registry.call_key(call_id), call_id) != call_id:
                other = values.printable(keys[registry.call_key(call_id)], values.MAX_QUOTED)
                return f"turn {number}: call ids '{shown}' and '{other}' name the same call step"
    return ""


def _turn(
    task: Task,
    step: registry.AgentRun,
    progress: Progress,
    turn: replay.NewTurn,
    now: datetime,
    turns: dict[int, dict[str, Any]],
) -> Decision:
    row = AgentTurn(
        task=task,
        step=step.name,
        turn=turn.turn,
        agent=turn.agent[:128],
        model_id=turn.model_id[:128],
        response=_sealed_turn(task, step, turn),
        state_version=task.state_version,
        recorded_at=now,
    )
    calls = [item.get("name") for item in turn.items if item.get("type") == "function_call"]
    said = f"asks for {', '.join(map(str, calls))}" if calls else "answers"
    reason = f"turn {turn.turn}: {turn.agent} {said}"
    code = "agent_turn"
    if turn.handed_off_from:
        reason = f"turn {turn.turn}: {turn.handed_off_from} handed off to {turn.agent}, which {said}"
        code = "agent_handoff"
    reply = llm.Reply(
        "",
        turn.model_id,
        input_tokens=turn.usage.get("input_tokens"),
        output_tokens=turn.usage.get("output_tokens"),
    )
    also = (usage.recorder(task, step.name, reply, committed=True, now=now),) if usage.reported(reply) else ()
    reused = _reused_call_id({**turns, turn.turn: {"items": turn.items}})
    if reused:  # the turn is kept, for the operator to read; none of its calls is performed
        return dataclasses.replace(quarantine(progress, CALL_ID_REUSED, reused), records=(row,), also=also)
    # The tool set this turn was planned with: resume validation compares it with the code's.
    planned = {**progress.facts, toolsets.fact_name(step): toolsets.toolset_id(step)}
    if turn.turn == 1:  # the run's first record: from here the checkpoint counts its stored states
        planned.setdefault(snapshots.fact_name(step.name), 0)
    return Decision(
        State.READY,
        Trigger.STEP,
        progress.model_copy(update={"step": step.name, "facts": planned}),
        reason=reason,
        reason_code=code,
        records=(row,),
        also=also,
        changes={"attempt": 0} if task.attempt else {},
    )


def _sealed_turn(task: Task, step: registry.AgentRun, turn: replay.NewTurn) -> Any:
    return sealing.seal(
        {"items": turn.items, "usage": turn.usage}, _turn_place(task.id, step.name, turn.turn)
    )


def _arguments_as_facts(base: str, call: replay.Call) -> dict[str, Any]:
    return {f"{base}.{name}": as_fact(value) for name, value in call.arguments.items()}


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _malformed(turns: dict[int, dict[str, Any]], call: replay.Call) -> str:
    """Why the arguments the model sent for ``call`` (as its recorded turn holds them) are not a JSON
    object of storable values; "" when they are. (The run's own parse reads anything else as no
    arguments at all, which must not reach an effect or an approver as an empty request.)"""
    sent = next(
        (
            item.get("arguments")
            for turn in turns.values()
            for item in turn.get("items", [])
            if item.get("type") == "function_call" and str(item.get("call_id")) == call.call_id
        ),
        None,
    )
    if not isinstance(sent, str):
        return "no recorded turn holds its arguments"
    try:
        parsed = json.loads(sent, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return "its arguments are not JSON (a JSON object of the tool's parameters is expected)"
    if not isinstance(parsed, dict):
        kind = _JSON_KINDS.get(type(parsed), "value")
        return f"its arguments are a JSON {kind}, not an object of the tool's parameters"
    for name, value in parsed.items():
        problem = values.text_problem(name)
        if problem:
            return f"an argument's name {problem}"
        try:
            as_fact(value)
        except values.Unstorable as exc:
            return f"its argument '{values.printable(name, 64)}' {exc.problem}"
    return ""


def _refusal(
    kind: registry.TaskType,
    step: registry.AgentRun,
    call: replay.Call,
    turns: dict[int, dict[str, Any]],
    facts: dict[str, Any],
) -> tuple[str, str] | None:
    """The reason code and message refusing ``call`` (module docstring), or None to go on with it."""
    named = f"{call.tool} ({values.printable(call.call_id, values.MAX_QUOTED)})"
    problem = _malformed(turns, call)
    if problem:
        return ARGUMENTS_MALFORMED, f"{named} refused: {problem}"
    tool = step.tool(call.tool)
    if isinstance(tool, registry.AgentEffect) and tool.binding is not None:
        # The arguments as the call's facts hold them: what the send-time check reads (runtime.dispatch).
        arguments = {name: as_fact(value) for name, value in call.arguments.items()}
        unbound = tool.binding.unbound(arguments, facts)
        if unbound:
            return (
                registry.ARGUMENT_UNBOUND,
                f"{named} refused: {values.printable(unbound, MAX_FAILURE_CHARS)}",
            )
    return None


def _refused_call(
    task: Task, progress: Progress, facts: dict[str, Any], call: replay.Call, code: str, why: str
) -> Decision:
    """Tell the model its call was refused (the call's output), performing nothing."""
    base = registry.call_step(call.tool, call.call_id)
    told = json.dumps({"ok": False, "error": why})
    return _told(task, progress, {**facts, f"{base}:output": as_fact(told)}, why, code=code)


def _call(
    task: Task,
    kind: registry.TaskType,
    step: registry.AgentRun,
    progress: Progress,
    facts: dict[str, Any],
    call: replay.Call,
    now: datetime,
    perform: Perform,
    turns: dict[int, dict[str, Any]],
) -> Decision:
    tool = step.tool(call.tool)
    base = registry.call_step(call.tool, call.call_id)
    refused = _refusal(kind, step, call, turns, facts)
    if refused is not None:
        return _refused_call(task, progress, facts, call, *refused)
    if isinstance(tool, registry.AgentEvidence):
        record_id = str(call.arguments.get(tool.record_from, ""))
        try:
            record = evidence.fetch(tool.system, record_id, tenant=task.tenant.slug)
            accepted = evidence.facts_from(record, tool.facts)
        except evidence.EvidenceUnstorable as exc:
            return quarantine(progress, "evidence_unstorable", str(exc))
        except evidence.EvidenceUnavailable as exc:
            return retry_later(task, kind, progress, now, code="evidence_unavailable", reason=str(exc))
        except evidence.EvidenceMissing as exc:  # the model is told, and decides what that means
            told = json.dumps({"found": False, "error": str(exc)})
            return _told(task, progress, {**facts, f"{base}:output": told}, f"{call.tool}: {exc}")
        hidden = kind.sensitive - kind.model_sees
        told = json.dumps(
            {name: ("[sealed]" if name in hidden else value) for name, value in accepted.items()},
            sort_keys=True,
            default=str,
        )
        ref = EvidenceRef(
            system=record.system, record_id=record.record_id, record_version=record.version, fetched_at=now
        )
        kept = [e for e in progress.evidence if (e.system, e.record_id) != (ref.system, ref.record_id)]
        return _told(
            task,
            progress.model_copy(update={"evidence": [*kept, ref]}),
            # The record's id beside its facts: an effect bound to this evidence names this record.
            {**facts, **accepted, registry.read_fact(call.tool): record_id, f"{base}:output": as_fact(told)},
            f"{call.tool} read {tool.system}/{record_id} v{record.version}",
            code="agent_evidence",
        )
    if not isinstance(tool, registry.AgentEffect):
        return quarantine(
            progress, "agent_tool_undeclared", f"tool {call.tool!r} is not declared to the ledger"
        )
    moved = progress.model_copy(update={"step": base, "facts": {**facts, **_arguments_as_facts(base, call)}})
    calls = f"calls {call.tool} ({call.call_id}) through {tool.connector}"
    # The call's own step decides at once, on the engine's path (its intent, or its approval first):
    # one transition where moving there and deciding would take two.
    decided = perform(kind.step_as(base, registry.Dispatch), moved)
    if decided is None:
        return Decision(State.READY, Trigger.STEP, moved, reason=calls, reason_code="agent_tool_call")
    said = f"{calls}: {decided.reason}" if decided.reason else calls
    return dataclasses.replace(decided, reason=said, reason_code=decided.reason_code or "agent_tool_call")


def _told(
    task: Task, progress: Progress, facts: dict[str, Any], reason: str, code: str = "agent_evidence"
) -> Decision:
    return Decision(
        State.READY,
        Trigger.STEP,
        progress.model_copy(update={"facts": facts}),
        reason=reason,
        reason_code=code,
        changes={"attempt": 0} if task.attempt else {},
    )


def _pause(
    task: Task,
    kind: registry.TaskType,
    step: registry.AgentRun,
    progress: Progress,
    facts: dict[str, Any],
    paused: replay.Paused,
    now: datetime,
    turns: dict[int, dict[str, Any]],
) -> Decision:
    """Ask our approvers for the first undecided call, storing the run state when the pause is new.

    A call refused for its arguments (module docstring) is never asked about: the run state is stored
    all the same, and the resumed run is told the refusal as that call's output."""
    if not paused.undecided:  # every interruption is decided, yet the SDK paused: nothing we can approve
        return quarantine(progress, "agent_pause_undecidable", "the agent paused with no call left to decide")
    call = paused.undecided[0]
    tool = step.tool(call.tool)
    if not isinstance(tool, registry.AgentEffect):
        return quarantine(
            progress,
            "agent_tool_undeclared",
            f"the agent paused for {call.tool!r}, which is not an AgentEffect",
        )
    refused = _refusal(kind, step, call, turns, facts)
    if refused is None:
        for each in paused.undecided:
            if not _malformed(turns, each):  # a malformed one is refused when its turn to be asked comes
                facts.update(_arguments_as_facts(registry.call_step(each.tool, each.call_id), each))
    records: tuple[Any, ...] = ()
    if paused.fresh:
        try:
            records = (
                snapshots.taken(
                    task,
                    step.name,
                    paused.turns,
                    paused.state,
                    schema=replay.schema_version_of(paused.state),
                    sdk_version=replay.SDK_VERSION,
                    now=now,
                ),
            )
        except snapshots.SnapshotRefused as exc:
            return quarantine(progress, exc.code, str(exc))
        facts.update(snapshots.counted(facts, step.name))  # committed with the state it counts
    if refused is not None:
        told = _refused_call(task, progress, facts, call, *refused)
        return dataclasses.replace(told, records=(*records, *told.records))
    base = registry.call_step(call.tool, call.call_id)
    ask = kind.step_as(f"{base}{registry.APPROVE_SUFFIX}", registry.RequestApproval)
    asked = approvals.request_decision(
        task,
        kind,
        ask,
        progress.model_copy(update={"facts": facts}),
        now=now,
        why=f"{step.agent_name} asks to call {call.tool} ({call.call_id}): {ask.reason}",
    )
    return dataclasses.replace(asked, records=(*records, *asked.records))


def refused_run(task: Task, kind: registry.TaskType, call_step: str, progress: Progress) -> Decision | None:
    """The refusal the run owning ``call_step`` (one of its tool calls) would meet on resuming from its
    stored run state, met before the call's intent instead: nothing is sent for a run that cannot go
    on after it. None when the run has no stored state, or one this worker resumes from."""
    owner = next((run for run in kind.agent_runs if run.call_steps(call_step) is not None), None)
    stored = snapshots.latest(task, owner.name, progress.facts) if owner is not None else None
    if stored is None:
        return None
    try:
        snapshots.opened(stored, readable=READABLE_SCHEMAS)
    except snapshots.SnapshotRefused as exc:
        return _refused(task, progress, exc.code, str(exc))
    return None


def _refused(task: Task, progress: Progress, code: str, why: str) -> Decision:
    """A stored run state we will not resume from: the task is held with the reason; an altered one
    raises an alert with the quarantine."""
    held = quarantine(progress, code, why)
    if code != snapshots.TAMPERED:
        return held

    def raise_alert() -> None:
        alerts.raise_for(AlertKind.EFFECT_DIGEST_MISMATCH, task.id)

    return dataclasses.replace(held, also=(raise_alert,))
