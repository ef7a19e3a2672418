"""Rebuild an SDK agent run from our records, and take it one unit of work further.

Each step of an ``AgentRun`` runs the SDK's ``Runner`` from where the task's records say the run
stands: from its first message, or from the newest paused run state (``snapshots``). Everything the
run did before is replayed, never done again: a recorded model turn is handed back as the model's
response (``_RecordedModel``), a recorded tool call's output is handed back as the tool's result
(``_recorded_tool``). The first thing the records do not hold stops the run there and is returned
for the step to commit:

- ``NewTurn``: the model was asked (once) and answered; the step records the answer with its
  transition, and the next step replays it;
- ``CallNeeded``: a tool call nothing has performed yet (the first of the turn's calls in the
  model's order, so parallel calls start in a fixed order); the step performs it as a step of its own;
- ``Paused``: the SDK stopped for approvals (``needs_approval``); the step stores the run state
  and asks our approvers;
- ``Finished``: the agent's final answer.

No database here: the step reads the records before and commits after. The SDK's own tracing is off
(it would send spans to OpenAI); the step's spans are ours.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    Model,
    ModelResponse,
    OpenAIChatCompletionsModel,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    RunContextWrapper,
    RunHooks,
    Runner,
    RunState,
    Usage,
)
from agents.run_state import SUPPORTED_SCHEMA_VERSIONS
from agents.version import __version__ as SDK_VERSION
from django.conf import settings
from openai import AsyncOpenAI
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter

from tasks import registry

_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])

__all__ = ["READABLE_SCHEMAS", "SDK_VERSION", "Recorded", "run", "schema_version_of", "tool_names"]

# The run state schemas this SDK reads: a snapshot of any other was written by a newer SDK.
READABLE_SCHEMAS: frozenset[str] = frozenset(SUPPORTED_SCHEMA_VERSIONS)


class RunStateUnusable(Exception):
    """The SDK could not rebuild the stored run state for this agent (a tool or agent it names is
    gone, or the text is not one it wrote)."""


class _Stop(Exception):
    """Raised inside the run where the records end: the run stops, what stopped it is in the box."""


class AgentFailed(Exception):
    """The run cannot go on (a guardrail tripped, too many turns, a tool the type does not declare).

    ``code`` is the reason code of the transition that records it."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class TurnTimedOut(Exception):
    """The model did not answer within the step's timeout."""


class TurnInterrupted(Exception):
    """A cancel request came while the model was answering: its answer is not used."""


@dataclass(frozen=True)
class Call:
    call_id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class NewTurn:
    turn: int
    agent: str
    model_id: str
    items: list[dict[str, Any]]
    usage: dict[str, int]
    handed_off_from: str = ""  # the agent the run was with before this turn, when a handoff moved it


@dataclass(frozen=True)
class CallNeeded:
    call: Call


@dataclass(frozen=True)
class Paused:
    undecided: list[Call]  # the interruptions our records hold no decision for, in the model's order
    state: str  # the SDK's run state at the pause (its ``to_string``)
    turns: int
    fresh: bool  # a new pause (store the state) rather than the stored one met again


@dataclass(frozen=True)
class Finished:
    output: str
    agent: str


Outcome = NewTurn | CallNeeded | Paused | Finished


@dataclass(frozen=True)
class Recorded:
    """What the task's records hold for the run, read by the step before it runs."""

    turns: Mapping[int, Mapping[str, Any]]  # turn -> {"items": [...], "usage": {...}, "agent": name}
    outputs: Mapping[str, str]  # call id -> the tool's result as the SDK is told it
    rejected: Mapping[str, str]  # call id -> why an approver refused it (what the model is told)
    start: str = ""  # the snapshot text the run resumes from ("" = from its first message)
    start_turns: int = 0  # model turns taken before that snapshot


@dataclass
class _Box:
    """What one replay found where the records end (set once, by whatever got there first)."""

    turn: int = 0
    agent: str = ""
    new_turn: NewTurn | None = None
    attempted: list[Call] = field(default_factory=list)
    last_calls: list[str] = field(default_factory=list)  # call ids of the latest turn, in order


def tool_names(agent: Any) -> set[str]:
    """Every function tool's name in ``agent`` and the agents it can hand off to."""
    return {tool.name for each in _agents_of(agent) for tool in each.tools if isinstance(tool, FunctionTool)}


def _agents_of(agent: Any) -> list[Any]:
    found: list[Any] = []
    pending = [agent]
    while pending:
        each = pending.pop()
        if any(each is seen for seen in found):
            continue
        if not isinstance(each, Agent):
            raise AgentFailed(
                "agent_handoff_unsupported",
                f"a handoff to {type(each).__name__} (list the target Agent itself, so its tools are ours)",
            )
        found.append(each)
        pending.extend(each.handoffs)
    return found


def schema_version_of(state: str) -> str:
    try:
        version = json.loads(state).get("$schemaVersion")
    except (ValueError, AttributeError):
        return ""
    return str(version or "")


def run(
    run_step: registry.AgentRun,
    first_message: str,
    recorded: Recorded,
    *,
    context: dict[str, Any],
    timeout: float | None,
    cancel: threading.Event | None,
) -> Outcome:
    """Replay ``run_step``'s agent over ``recorded`` and return the first thing the records lack.

    Raises ``AgentFailed``, ``TurnTimedOut``, ``TurnInterrupted``, or the model's own error (the
    step decides what each means), and ``RunStateRefused`` from ``snapshots`` callers' checks is
    theirs: the state text here is the one they checked.
    """
    replayed = functools.partial(_run, run_step, first_message, recorded, context, timeout, cancel)
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # the worker's ordinary case: no loop in this thread, the run gets one
        return asyncio.run(replayed())
    # An event loop already runs in this thread (called from async code, or a test thread a browser
    # driver's loop runs in): asyncio.run would refuse, so the run gets a thread and a loop of its own.
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="agent-run") as pool:
        return pool.submit(lambda: asyncio.run(replayed())).result()


def _model_for(run_step: registry.AgentRun) -> tuple[Model, str]:
    """The model new turns ask, and its id: any OpenAI-compatible server when ``MODEL_BACKEND`` is
    ``openai`` (``MODEL_URL``), else the agent's own ``Model`` (the demo's and the tests'
    deterministic one). Made inside the run's event loop: the HTTP client belongs to it."""
    if settings.MODEL_BACKEND == "openai":
        client = AsyncOpenAI(
            base_url=settings.MODEL_URL,
            api_key=settings.MODEL_API_KEY or "unused",
            timeout=settings.MODEL_TIMEOUT,
            max_retries=0,  # a failed turn is retried by the task's backoff, as a transition
        )
        return OpenAIChatCompletionsModel(
            settings.MODEL_NAME, client
        ), f"openai-compatible:{settings.MODEL_NAME}"
    own = getattr(run_step.agent, "model", None)
    if isinstance(own, Model):
        return own, str(getattr(own, "model_id", "") or type(own).__name__)
    raise AgentFailed(
        "agent_model_unset",
        f"agent {run_step.agent_name!r} names no Model object and MODEL_BACKEND is not 'openai'",
    )


async def _run(
    run_step: registry.AgentRun,
    first_message: str,
    recorded: Recorded,
    context: dict[str, Any],
    timeout: float | None,
    cancel: threading.Event | None,
) -> Outcome:
    box = _Box(turn=recorded.start_turns)
    box.last_calls = _call_ids(list(recorded.turns.get(recorded.start_turns, {}).get("items", [])))
    agent = _wrapped(run_step, recorded, box)
    model, model_id = _model_for(run_step)
    recording = _RecordedModel(model, model_id, recorded, box, timeout, cancel)
    config = RunConfig(model=recording, tracing_disabled=True, trace_include_sensitive_data=False)
    start: str | RunState[Any] = first_message
    if recorded.start:
        start = await _resumed(agent, recorded)
    try:
        result = await Runner.run(
            agent,
            start,
            context=context,
            max_turns=run_step.max_turns,
            run_config=config,
            hooks=_Hooks(box),
        )
    except (TurnTimedOut, TurnInterrupted, RunStateUnusable):
        raise
    except InputGuardrailTripwireTriggered as exc:
        raise AgentFailed("agent_guardrail_tripped", f"input guardrail {_guardrail(exc)} tripped") from None
    except OutputGuardrailTripwireTriggered as exc:
        raise AgentFailed("agent_guardrail_tripped", f"output guardrail {_guardrail(exc)} tripped") from None
    except MaxTurnsExceeded:
        raise AgentFailed(
            "agent_max_turns", f"the agent took more than {run_step.max_turns} turns without a final answer"
        ) from None
    except Exception:
        stopped = _stopped_at(box)
        if stopped is None:
            raise
        return stopped
    stopped = _stopped_at(box)
    if stopped is not None:  # the SDK swallowed our stop (a tool error policy): the records still end there
        return stopped
    if result.interruptions:
        calls = [_call_of(item) for item in result.interruptions]
        undecided = [
            c for c in calls if c.call_id not in recorded.outputs and c.call_id not in recorded.rejected
        ]
        fresh = not recorded.start or box.turn != recorded.start_turns
        return Paused(undecided, result.to_state().to_string(), box.turn, fresh=fresh)
    return Finished(_text(result.final_output), result.last_agent.name)


async def _resumed(agent: Agent[Any], recorded: Recorded) -> RunState[Any]:
    """The stored run state with every interruption our records decided applied: approved when the
    call was approved (its tool then replays the recorded output), rejected with the approver's reason."""
    try:
        state: RunState[Any] = await RunState.from_string(agent, recorded.start)
    except Exception as exc:  # the SDK's own errors for a state it cannot rebuild, whatever their class
        raise RunStateUnusable(f"the stored run state does not fit agent {agent.name!r}: {exc}") from None
    for item in state.get_interruptions():
        call = _call_of(item)
        if call.call_id in recorded.rejected:
            state.reject(item, rejection_message=recorded.rejected[call.call_id])
        elif call.call_id in recorded.outputs:
            state.approve(item)
    return state


def _stopped_at(box: _Box) -> Outcome | None:
    if box.new_turn is not None:
        return box.new_turn
    if box.attempted:
        order = {call_id: index for index, call_id in enumerate(box.last_calls)}
        first = min(box.attempted, key=lambda c: order.get(c.call_id, len(order)))
        return CallNeeded(first)
    return None


def _call_of(item: Any) -> Call:
    raw = item.raw_item
    call_id = str(getattr(raw, "call_id", "") or (raw.get("call_id") if isinstance(raw, dict) else ""))
    return Call(call_id, str(item.name), _arguments(item.arguments or "{}"))


def _arguments(text: str) -> dict[str, Any]:
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _text(output: Any) -> str:
    if isinstance(output, str):
        return output
    dump = getattr(output, "model_dump", None)
    return json.dumps(dump(mode="json") if callable(dump) else output, sort_keys=True, default=str)


def _guardrail(exc: Exception) -> str:
    result = getattr(exc, "guardrail_result", None)
    guardrail = getattr(result, "guardrail", None)
    return str(getattr(guardrail, "name", None) or getattr(guardrail, "get_name", lambda: "")() or "?")


# --- the agent as we run it: its tools answer from our records ---------------------------------------


def _wrapped(run_step: registry.AgentRun, recorded: Recorded, box: _Box) -> Agent[Any]:
    """A copy of ``run_step.agent`` (and of every agent it hands off to) whose function tools answer
    from the records and whose approvals follow our declaration."""
    copies: dict[int, Agent[Any]] = {}

    def copy(agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in copies:
            return copies[id(agent)]
        clone = agent.clone(tools=[])
        copies[id(agent)] = clone
        tools: list[Any] = []
        for tool in agent.tools:
            if not isinstance(tool, FunctionTool):
                raise AgentFailed(
                    "agent_tool_unsupported", f"{agent.name}: {type(tool).__name__} is not a function tool"
                )
            declared = run_step.tool(tool.name)
            if declared is None:
                raise AgentFailed(
                    "agent_tool_undeclared",
                    f"{agent.name}: tool {tool.name!r} is not declared to the ledger"
                    " (an AgentEffect or AgentEvidence of the step)",
                )
            tools.append(_recorded_tool(tool, declared, recorded, box))
        clone.tools = tools
        clone.handoffs = [copy(target) for target in agent.handoffs if isinstance(target, Agent)]
        return clone

    _agents_of(run_step.agent)  # refuses a handoff we cannot follow before anything runs
    return copy(run_step.agent)


def _recorded_tool(
    tool: FunctionTool, declared: registry.AgentTool, recorded: Recorded, box: _Box
) -> FunctionTool:
    async def invoke(ctx: Any, arguments: str) -> str:
        call_id = str(getattr(ctx, "tool_call_id", ""))
        if call_id in recorded.rejected:  # asked and refused without an SDK pause (a policy finding)
            return recorded.rejected[call_id]
        if call_id in recorded.outputs:
            return recorded.outputs[call_id]
        box.attempted.append(Call(call_id, tool.name, _arguments(arguments)))
        raise _Stop(call_id)

    needs: Any = False  # a read-only tool never waits for an approver
    if isinstance(declared, registry.AgentEffect):
        own = tool.needs_approval

        async def needs(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
            """Our declaration (the money table) first; the agent's own flag can only add a pause."""
            if declared.needs_approval(params):
                return True
            if callable(own):
                return bool(await own(ctx, params, call_id))
            return bool(own)

    return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=needs)


class _Hooks(RunHooks[Any]):
    """Follows which agent the run is with (a handoff moves it), for the turn records."""

    def __init__(self, box: _Box) -> None:
        self.box = box

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        self.box.agent = agent.name


# --- the model as we run it: a recorded turn is replayed, a new one asked once ---------------------------


class _RecordedModel(Model):
    def __init__(
        self,
        inner: Model,
        model_id: str,
        recorded: Recorded,
        box: _Box,
        timeout: float | None,
        cancel: threading.Event | None,
    ) -> None:
        self.inner = inner
        self.model_id = model_id
        self.recorded = recorded
        self.box = box
        self.timeout = timeout
        self.cancel = cancel

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.box.turn += 1
        turn = self.box.turn
        kept = self.recorded.turns.get(turn)
        if kept is not None:
            response = ModelResponse(
                output=_ITEMS.validate_python(kept["items"]),
                usage=Usage(**{k: v for k, v in dict(kept.get("usage") or {}).items() if k in _USAGE_FIELDS}),
                response_id=None,
            )
            self.box.last_calls = _call_ids(kept["items"])
            return response
        if self.cancel is not None and self.cancel.is_set():
            raise TurnInterrupted("a cancel request came before the model turn started")
        answer = await self._ask(*args, **kwargs)
        if self.cancel is not None and self.cancel.is_set():
            raise TurnInterrupted("a cancel request came while the model was answering")
        items = [item.model_dump(mode="json", exclude_none=True) for item in answer.output]
        usage = {
            "requests": answer.usage.requests,
            "input_tokens": answer.usage.input_tokens,
            "output_tokens": answer.usage.output_tokens,
            "total_tokens": answer.usage.total_tokens,
        }
        before = str(self.recorded.turns.get(turn - 1, {}).get("agent", ""))
        self.box.new_turn = NewTurn(
            turn, self.box.agent, self.model_id, items, usage,
            handed_off_from=before if before and before != self.box.agent else "",
        )  # fmt: skip
        raise _Stop(f"turn {turn}")

    async def _ask(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The inner model's answer, abandoned at the step's timeout or at a cancel request (looked
        at every ``_POLL`` seconds: the event is a thread's, not the loop's)."""
        asked = asyncio.ensure_future(self.inner.get_response(*args, **kwargs))
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        while True:
            left = _POLL if deadline is None else min(_POLL, deadline - loop.time())
            done, _ = await asyncio.wait([asked], timeout=max(left, 0))
            if done:
                return asked.result()
            if self.cancel is not None and self.cancel.is_set():
                asked.cancel()
                raise TurnInterrupted("a cancel request interrupted the model turn")
            if deadline is not None and loop.time() >= deadline:
                asked.cancel()
                raise TurnTimedOut(f"model turn timed out after {self.timeout:g} s")

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("durable agent runs do not stream")


_POLL = 0.05
_USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "total_tokens")


def _call_ids(items: list[Mapping[str, Any]]) -> list[str]:
    return [str(item.get("call_id")) for item in items if item.get("type") == "function_call"]
