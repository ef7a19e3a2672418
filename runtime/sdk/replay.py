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

Replaying every turn on every step costs O(turns²) SDK work a run. So a run stopped at a new turn or
at a lone call is not thrown away: it waits, suspended in this process's agent loop (``_Live``), and
the next step of the same run goes on from there once its records hold what the run waits for
(the committed turn, the call's result). It goes on only if everything it was handed is still what
the records say; otherwise it is dropped and the step replays as above. Either way what the run is
told comes from the records, never from its own memory: a turn it asked is handed back from the
committed record, and a dropped run asks the model nothing more.

A recorded turn that cannot be handed back (garbled, missing while a later one is there, refused by
the SDK) raises ``Unreplayable`` (``agent_turn_unreplayable``): the step quarantines the task.

No database here: the step reads the records before and commits after. The SDK's spans join our
OpenTelemetry trace (``tracing``); its exporter to OpenAI is never installed.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    Model,
    ModelBehaviorError,
    ModelResponse,
    ModelRetrySettings,
    ModelSettings,
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
from openai import APITimeoutError, AsyncOpenAI
from openai.types.responses import ResponseOutputItem
from opentelemetry import context as otel_context
from opentelemetry import trace
from pydantic import TypeAdapter, ValidationError

from runtime.sdk import toolsets, tracing
from tasks import registry

tracing.install()  # the SDK's spans go to our OpenTelemetry traces, never to OpenAI

_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])

__all__ = ["READABLE_SCHEMAS", "SDK_VERSION", "UNREPLAYABLE", "Recorded", "run", "schema_version_of"]

# The reason code of a run whose recorded turns the SDK cannot be handed back (``AgentFailed``).
UNREPLAYABLE = "agent_turn_unreplayable"

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


class Unreplayable(AgentFailed):
    """A recorded turn cannot be handed back to the SDK: its record is garbled, missing while a later
    one is there, or one the SDK refuses (a tool the agent no longer has). Retrying cannot help, and
    asking the model instead would be a second answer to a committed turn: the step holds the task."""

    def __init__(self, turn: int, why: str) -> None:
        super().__init__(UNREPLAYABLE, f"recorded turn {turn} of the agent's run cannot be replayed: {why}")


class TurnTimedOut(Exception):
    """The model did not answer within the step's timeout."""


class TurnInterrupted(Exception):
    """A cancel request came while the model was answering: its answer is not used."""


class ModelCallFailed(Exception):
    """The model was asked for a new turn and gave no usable answer (an HTTP error, a rate limit, a
    body that is not a completion, a refused connection): a transient failure, retried by the task.
    The message is the client's own, unredacted: the step redacts it before it becomes a reason."""


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
    said: list[dict[str, Any]] = field(default_factory=list)  # the run's items after its memory's


@dataclass(frozen=True)
class Unasked:
    """The run needs a new model turn, and this run was told not to ask for one (``run``'s ``ask``):
    it waits, kept, to ask it in the next step."""

    turn: int


Outcome = NewTurn | CallNeeded | Paused | Finished | Unasked


@dataclass(frozen=True)
class Recorded:
    """What the task's records hold for the run, read by the step before it runs."""

    turns: Mapping[int, Mapping[str, Any]]  # turn -> {"items": [...], "usage": {...}, "agent": name}
    outputs: Mapping[str, str]  # call id -> the tool's result as the SDK is told it
    rejected: Mapping[str, str]  # call id -> why an approver refused it (what the model is told)
    start: str = ""  # the snapshot text the run resumes from ("" = from its first message)
    start_turns: int = 0  # model turns taken before that snapshot
    memory: list[dict[str, Any]] = field(default_factory=list)  # the conversation's items before the run


@dataclass
class _Box:
    """What one replay found where the records end (set once, by whatever got there first)."""

    turn: int = 0
    agent: str = ""
    replayed: int = 0  # the latest turn handed back from the records
    attempted: list[Call] = field(default_factory=list)
    last_calls: list[str] = field(default_factory=list)  # call ids of the latest turn, in order


def _agents_of(agent: Any) -> list[Any]:
    """``agent`` and every agent it can hand off to; refuses a handoff to anything but an ``Agent``
    (its tools would be out of our reach)."""
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
    ask: bool = True,
) -> Outcome:
    """Replay ``run_step``'s agent over ``recorded`` and return the first thing the records lack.

    ``ask=False``: a run that needs a new model turn does not ask it, but stops there (``Unasked``),
    kept to ask it in the next step. The step passes it when ``recorded`` holds a turn it has not
    committed yet, to learn what that turn leads to and commit both at once.

    Raises ``AgentFailed`` (``Unreplayable`` among them), ``TurnTimedOut``, ``TurnInterrupted``,
    ``RunStateUnusable`` (the stored state does not fit the agent), or the model's own error: the
    step decides what each means. The state text in ``recorded`` is one the step has checked already
    (``snapshots.opened``).

    The run goes on in this process's agent loop (``_loop``), whatever the caller's thread (a
    worker's slot, or one whose own event loop runs): there a run stopped where the records ended
    waits for the next step (``_Live``), which goes on from there instead of replaying it all again.
    """
    feed = _Feed(recorded, timeout, cancel, otel_context.get_current(), ask)
    done: Future[Outcome] = Future()
    loop = _loop()
    caller = contextvars.copy_context()  # the step's span and whatever else its thread carries

    def start() -> None:
        stepped = loop.create_task(_step(run_step, first_message, context, feed), context=caller)
        stepped.add_done_callback(functools.partial(_settle, done))

    loop.call_soon_threadsafe(start)
    return done.result()


def _settle(done: Future[Outcome], stepped: asyncio.Task[Outcome]) -> None:
    if stepped.cancelled():
        done.cancel()
    elif (error := stepped.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(stepped.result())


class _AgentLoop:
    """The process's event loop for agent runs, in a daemon thread of its own (made again in a forked
    child: a thread does not survive the fork). Every run of the process shares it, so code of the
    agent's that blocks (a synchronous guardrail or instructions function doing I/O) holds up the
    others: make it async, as the SDK's own model clients are."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self) -> asyncio.AbstractEventLoop:
        with self.lock:
            if self.loop is None or self.pid != os.getpid():
                self.loop = asyncio.new_event_loop()
                self.pid = os.getpid()
                threading.Thread(target=self.loop.run_forever, name="agent-runs", daemon=True).start()
            return self.loop


_loop = _AgentLoop()


@dataclass
class _Feed:
    """What the step running now hands the run: its records, its model turn's timeout and cancel
    signal, and its trace context (a new turn is a span of the step that asks it)."""

    recorded: Recorded
    timeout: float | None
    cancel: threading.Event | None
    trace: otel_context.Context
    ask: bool = True  # a new turn may be asked of the model (``run``)


# Runs kept waiting for their next step, per process (the agent loop's own: touched only there). A
# run's next step almost always comes to the worker that took the last one (a claim runs a task until
# it waits); one that does not is dropped when the bound or the idle time is passed.
LIVE_RUNS_KEPT = 256
LIVE_RUN_IDLE = 300.0  # seconds
_LIVE: OrderedDict[tuple[Any, ...], _Live] = OrderedDict()


class _Live:
    """One SDK run, suspended where the records ended (a new turn asked, a lone call to perform) until
    the step that committed it comes back with records that hold it.

    It goes on only if everything it was handed is still what the records say: the same agent (its
    objects, by identity), brief, memory and model settings, every turn and call result it was
    given unchanged, and the thing it waits for recorded. Anything else (a commit that failed, a turn
    row altered, a deployment's new agent, the task advanced by another worker) drops it, and the step
    replays from the records as if it had never been kept: the records stay the only authority."""

    def __init__(
        self,
        key: tuple[Any, ...],
        run_step: registry.AgentRun,
        first_message: str,
        context: dict[str, Any],
        fingerprint: tuple[Any, ...],
        feed: _Feed,
    ) -> None:
        self.key = key
        self.run_step = run_step
        self.first_message = first_message
        self.context = context
        self.fingerprint = fingerprint
        self.feed = feed
        self.memory = feed.recorded.memory
        recorded = feed.recorded
        self.box = _Box(turn=recorded.start_turns)
        self.box.last_calls = _call_ids(_items_of(recorded.turns.get(recorded.start_turns)))
        self.handed: dict[int, Any] = {}  # turn -> the items handed back as its response
        self.told: dict[str, tuple[str, str]] = {}  # call id -> what the run was told of it
        self.waits_for: tuple[str, int | str] = ("", "")
        self.stopped: asyncio.Future[Outcome] | None = None
        self.going_on: asyncio.Future[None] | None = None
        self.task: asyncio.Task[Outcome] | None = None
        self.used = 0.0
        self.dead = False

    async def begin(self) -> Outcome:
        self.stopped = asyncio.get_running_loop().create_future()
        self.task = asyncio.get_running_loop().create_task(_run(self))
        return await self._next()

    async def resume(self, feed: _Feed) -> Outcome:
        assert self.going_on is not None
        self.feed = feed
        self.stopped = asyncio.get_running_loop().create_future()
        self.going_on.set_result(None)
        return await self._next()

    async def _next(self) -> Outcome:
        """Where the run stops now: kept for the next step, or what it ended with."""
        assert self.stopped is not None and self.task is not None
        await asyncio.wait((self.stopped, self.task), return_when=asyncio.FIRST_COMPLETED)
        if self.stopped.done():
            _keep(self)
            return self.stopped.result()
        return self.task.result()

    async def suspend(self, outcome: Outcome, waits_for: tuple[str, int | str]) -> None:
        """Inside the run: hand ``outcome`` to the step, and wait for the next step's records."""
        assert self.stopped is not None
        self.waits_for = waits_for
        self.going_on = asyncio.get_running_loop().create_future()
        self.stopped.set_result(outcome)
        await self.going_on  # cancelled with the run when it is dropped

    def told_of(self, call_id: str) -> str | None:
        told = _told(self.feed.recorded, call_id)
        if told is None:
            return None
        self.told[call_id] = told
        return told[1]

    def continues(
        self, run_step: registry.AgentRun, fingerprint: tuple[Any, ...], context: Any, recorded: Recorded
    ) -> bool:
        if (
            run_step is not self.run_step
            or not _same(fingerprint, self.fingerprint)
            or context != self.context
            or recorded.memory != self.memory
        ):
            return False
        if any(_items_of(recorded.turns.get(turn)) != items for turn, items in self.handed.items()):
            return False
        if any(_told(recorded, call_id) != told for call_id, told in self.told.items()):
            return False
        kind, what = self.waits_for
        if kind == "ask":  # stopped before asking a turn: nothing recorded to wait for
            return True
        if kind == "turn":
            return what in recorded.turns
        return kind == "call" and _told(recorded, str(what)) is not None

    def drop(self) -> None:
        self.dead = True  # nothing is asked of the model on its behalf from now on
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _told(recorded: Recorded, call_id: str) -> tuple[str, str] | None:
    if call_id in recorded.rejected:
        return ("rejected", recorded.rejected[call_id])
    if call_id in recorded.outputs:
        return ("output", recorded.outputs[call_id])
    return None


def _items_of(turn: Mapping[str, Any] | None) -> Any:
    return turn.get("items") if isinstance(turn, Mapping) else None


def _fingerprint(run_step: registry.AgentRun) -> tuple[Any, ...]:
    """What a run is built from: every field of every agent it can reach (the objects themselves: a
    model, tool or instructions swapped in place changes it) and the model settings."""
    parts: list[Any] = []
    for agent in _agents_of(run_step.sdk_agent()):
        for each in dataclasses.fields(agent):
            value = getattr(agent, each.name)
            parts.append(tuple(value) if isinstance(value, list) else value)
    parts.append(
        (settings.MODEL_BACKEND, settings.MODEL_URL, settings.MODEL_NAME, settings.MODEL_API_KEY,
         settings.MODEL_TIMEOUT)
    )  # fmt: skip
    return tuple(parts)


def _same(these: tuple[Any, ...], those: tuple[Any, ...]) -> bool:
    """Identity, element by element (one level into tuples): an equal but new object is a change."""
    if len(these) != len(those):
        return False
    for this, that in zip(these, those, strict=True):
        if isinstance(this, tuple) and isinstance(that, tuple):
            if not _same(this, that):
                return False
        elif this is not that and not (isinstance(this, str | int | float) and this == that):
            return False
    return True


async def _step(
    run_step: registry.AgentRun, first_message: str, context: dict[str, Any], feed: _Feed
) -> Outcome:
    """One step's run: the kept run going on when it may, else a run from the records."""
    recorded = feed.recorded
    now = asyncio.get_running_loop().time()
    while _LIVE and next(iter(_LIVE.values())).used < now - LIVE_RUN_IDLE:
        _LIVE.popitem(last=False)[1].drop()
    key = (id(run_step), first_message, recorded.start, recorded.start_turns)
    fingerprint = _fingerprint(run_step)  # refuses a handoff we cannot follow before anything runs
    kept = _LIVE.pop(key, None)
    if kept is not None:
        if kept.continues(run_step, fingerprint, context, recorded):
            return await kept.resume(feed)
        kept.drop()
    return await _Live(key, run_step, first_message, context, fingerprint, feed).begin()


def _keep(live: _Live) -> None:
    earlier = _LIVE.pop(live.key, None)
    if earlier is not None and earlier is not live:
        earlier.drop()  # another run with the very same key (a twin task): the newer one is kept
    if LIVE_RUNS_KEPT <= 0:
        live.drop()
        return
    live.used = asyncio.get_running_loop().time()
    _LIVE[live.key] = live
    while len(_LIVE) > LIVE_RUNS_KEPT:
        _LIVE.popitem(last=False)[1].drop()


def _model_for(run_step: registry.AgentRun) -> tuple[Model, str, AsyncOpenAI | None]:
    """The model new turns ask, its id, and the HTTP client to close after the run: any
    OpenAI-compatible server when ``MODEL_BACKEND`` is ``openai`` (``MODEL_URL``), else the agent's
    own ``Model`` (the demo's and the tests' deterministic one). Made inside the run's event loop:
    the HTTP client belongs to it.

    Nothing retries a failed request but the task: the client's own retries are off
    (``max_retries=0``), and so are the runner's (``NO_RETRIES``). A retry inside the run would
    be a second answer to the same turn, unrecorded, and a wait the task's backoff never sees;
    ours is a transition (``model_unavailable``, ``step_timeout``) with the type's capped backoff.
    An empty ``MODEL_URL`` is refused rather than left to the client, which would send the
    conversation to OpenAI's public endpoint."""
    if settings.MODEL_BACKEND == "openai":
        if not settings.MODEL_URL or not settings.MODEL_NAME:
            raise AgentFailed(
                "model_unconfigured", "MODEL_BACKEND is 'openai' but MODEL_URL or MODEL_NAME is not set"
            )
        client = AsyncOpenAI(
            base_url=settings.MODEL_URL,
            api_key=settings.MODEL_API_KEY or "unused",
            timeout=settings.MODEL_TIMEOUT,
            max_retries=0,
        )
        model = OpenAIChatCompletionsModel(settings.MODEL_NAME, client)
        return model, toolsets.model_id(run_step), client
    own = getattr(run_step.sdk_agent(), "model", None)
    if isinstance(own, Model):
        return own, toolsets.model_id(run_step), None
    raise AgentFailed(
        "agent_model_unset",
        f"agent {run_step.agent_name!r} names no Model object and MODEL_BACKEND is not 'openai'",
    )


# The runner's model settings for every run: no retry of a model call inside the run (see
# ``_model_for``). Set on the run, so they win over whatever the agent's own settings say.
NO_RETRIES = ModelSettings(retry=ModelRetrySettings(max_retries=0))


async def _run(live: _Live) -> Outcome:
    run_step = live.run_step
    agent = _wrapped(run_step, live)
    model, model_id, client = _model_for(run_step)
    config = RunConfig(
        model=_RecordedModel(model, model_id, live),
        model_settings=NO_RETRIES,
        workflow_name=f"{run_step.agent_name} ({run_step.name})",
        trace_include_sensitive_data=False,
    )
    try:
        return await _run_with(live, agent, config)
    finally:
        if client is not None:
            await client.close()


async def _run_with(live: _Live, agent: Agent[Any], config: RunConfig) -> Outcome:
    run_step, box, first = live.run_step, live.box, live.feed.recorded
    opening: list[Any] = [*first.memory, {"role": "user", "content": live.first_message}]
    start: str | list[Any] | RunState[Any] = opening if first.memory else live.first_message
    if first.start:
        start = await _resumed(agent, first)
    try:
        result = await Runner.run(
            agent,
            start,
            context=live.context,
            max_turns=run_step.max_turns,
            run_config=config,
            hooks=_Hooks(box),
        )
    except (TurnTimedOut, TurnInterrupted, RunStateUnusable, ModelCallFailed, AgentFailed):
        raise
    except InputGuardrailTripwireTriggered as exc:
        raise AgentFailed("agent_guardrail_tripped", f"input guardrail {_guardrail(exc)} tripped") from None
    except OutputGuardrailTripwireTriggered as exc:
        raise AgentFailed("agent_guardrail_tripped", f"output guardrail {_guardrail(exc)} tripped") from None
    except MaxTurnsExceeded:
        raise AgentFailed(
            "agent_max_turns", f"the agent took more than {run_step.max_turns} turns without a final answer"
        ) from None
    except Exception as exc:
        stopped = _stopped_at(box)
        if stopped is not None:
            return stopped
        if isinstance(exc, ModelBehaviorError) and box.replayed == box.turn:
            # The SDK refused what a recorded turn says (every turn it was handed is a recorded one):
            # it will refuse it on every replay.
            raise Unreplayable(box.turn, f"the SDK refuses it: {exc}") from None
        raise
    stopped = _stopped_at(box)
    if stopped is not None:  # the SDK swallowed our stop (a tool error policy): the records still end there
        return stopped
    recorded = live.feed.recorded
    if result.interruptions:
        calls = [_call_of(item) for item in result.interruptions]
        undecided = [
            c for c in calls if c.call_id not in recorded.outputs and c.call_id not in recorded.rejected
        ]
        fresh = not recorded.start or box.turn != recorded.start_turns
        return Paused(undecided, result.to_state().to_string(), box.turn, fresh=fresh)
    said = [dict(item) for item in result.to_input_list()[len(recorded.memory) :]]
    return Finished(_text(result.final_output), result.last_agent.name, said)


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
    """The first of the calls the run met with no result recorded, in the model's order (parallel
    calls: each is a step of its own, in a fixed order)."""
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


def _wrapped(run_step: registry.AgentRun, live: _Live) -> Agent[Any]:
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
            tools.append(_recorded_tool(tool, declared, live))
        clone.tools = tools
        clone.handoffs = [copy(target) for target in agent.handoffs if isinstance(target, Agent)]
        return clone

    return copy(run_step.sdk_agent())


def _recorded_tool(tool: FunctionTool, declared: registry.AgentTool, live: _Live) -> FunctionTool:
    async def invoke(ctx: Any, arguments: str) -> str:
        call_id = str(getattr(ctx, "tool_call_id", ""))
        told = live.told_of(call_id)  # the ledger's result, or an approver's refusal
        if told is not None:
            return told
        call = Call(call_id, tool.name, _arguments(arguments))
        if len(live.box.last_calls) == 1 and not live.dead:
            # The turn's only call: the run waits here for its result, performed by the steps to come.
            await live.suspend(CallNeeded(call), ("call", call_id))
            told = live.told_of(call_id)
            if told is not None:
                return told
        # Parallel calls: each stops the run, which the next step replays (the first in the model's
        # order is performed first, whichever the SDK started first).
        live.box.attempted.append(call)
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

    # No timeout of the SDK's around a call: the ledger's own bounds the sending, and a run kept
    # waiting for a call's result must not be told it timed out.
    return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=needs, timeout_seconds=None)


class _Hooks(RunHooks[Any]):
    """Follows which agent the run is with (a handoff moves it), for the turn records."""

    def __init__(self, box: _Box) -> None:
        self.box = box

    async def on_agent_start(self, context: Any, agent: Agent[Any]) -> None:
        self.box.agent = agent.name


# --- the model as we run it: a recorded turn is replayed, a new one asked once ---------------------------


class _RecordedModel(Model):
    def __init__(self, inner: Model, model_id: str, live: _Live) -> None:
        self.inner = inner
        self.model_id = model_id
        self.live = live
        self.box = live.box

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.box.turn += 1
        turn = self.box.turn
        if turn not in self.live.feed.recorded.turns and not self.live.feed.ask and not self.live.dead:
            await self.live.suspend(Unasked(turn), ("ask", turn))  # the next step's feed may ask it
        recorded = self.live.feed.recorded
        kept = recorded.turns.get(turn)
        if kept is not None:
            return self._replayed(turn, kept)
        if any(later > turn for later in recorded.turns):
            latest = max(recorded.turns)
            raise Unreplayable(turn, f"its record is missing, yet turn {latest} is recorded")
        if self.live.dead:
            raise _Stop(f"turn {turn}: the run was dropped")
        new = await self._new_turn(turn, *args, **kwargs)
        # The run waits for the step to commit the turn; what it goes on with is the record.
        await self.live.suspend(new, ("turn", turn))
        return self._replayed(turn, self.live.feed.recorded.turns[turn])

    async def _new_turn(self, turn: int, *args: Any, **kwargs: Any) -> NewTurn:
        feed = self.live.feed
        if feed.cancel is not None and feed.cancel.is_set():
            raise TurnInterrupted("a cancel request came before the model turn started")
        attributes: dict[str, str | int] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.model_id,
            "durable.agent": self.box.agent,
            "durable.turn": turn,
        }
        with tracing.tracer.start_as_current_span(
            f"chat {self.model_id}", context=feed.trace, kind=trace.SpanKind.CLIENT, attributes=attributes
        ) as span:
            answer = await self._ask(feed, *args, **kwargs)
            span.set_attribute("gen_ai.usage.input_tokens", answer.usage.input_tokens)
            span.set_attribute("gen_ai.usage.output_tokens", answer.usage.output_tokens)
        if feed.cancel is not None and feed.cancel.is_set():
            raise TurnInterrupted("a cancel request came while the model was answering")
        items = [item.model_dump(mode="json", exclude_none=True) for item in answer.output]
        usage = {"requests": answer.usage.requests}
        if answer.usage.input_tokens or answer.usage.output_tokens:
            # Counted. A server that sends no ``usage`` leaves the SDK's zeros, which are not a
            # count: kept out, the turn is unpriced rather than free (``runtime.usage``).
            usage.update(
                input_tokens=answer.usage.input_tokens,
                output_tokens=answer.usage.output_tokens,
                total_tokens=answer.usage.total_tokens,
            )
        earlier = feed.recorded.turns.get(turn - 1)
        before = str(earlier.get("agent", "")) if isinstance(earlier, Mapping) else ""
        return NewTurn(
            turn, self.box.agent, self.model_id, items, usage,
            handed_off_from=before if before and before != self.box.agent else "",
        )  # fmt: skip

    def _replayed(self, turn: int, kept: Mapping[str, Any]) -> ModelResponse:
        """The recorded turn as the model's response; ``Unreplayable`` when its record is not one."""
        items = _items_of(kept)
        try:
            output = _ITEMS.validate_python(items)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
            raise Unreplayable(turn, f"its record is not a model response ({problems})") from None
        self.live.handed[turn] = items
        self.box.replayed = turn
        self.box.last_calls = _call_ids(items)
        return ModelResponse(
            output=output,
            usage=Usage(**{k: v for k, v in dict(kept.get("usage") or {}).items() if k in _USAGE_FIELDS}),
            response_id=None,
        )

    async def _ask(self, feed: _Feed, *args: Any, **kwargs: Any) -> ModelResponse:
        """The inner model's answer, abandoned at the step's timeout or at a cancel request (looked
        at every ``_POLL`` seconds: the event is a thread's, not the loop's)."""
        asked = asyncio.ensure_future(self.inner.get_response(*args, **kwargs))
        loop = asyncio.get_running_loop()
        deadline = None if feed.timeout is None else loop.time() + feed.timeout
        while True:
            left = _POLL if deadline is None else min(_POLL, deadline - loop.time())
            done, _ = await asyncio.wait([asked], timeout=max(left, 0))
            if done:
                return self._answer(asked)
            if feed.cancel is not None and feed.cancel.is_set():
                asked.cancel()
                raise TurnInterrupted("a cancel request interrupted the model turn")
            if deadline is not None and loop.time() >= deadline:
                asked.cancel()
                raise TurnTimedOut(f"model turn timed out after {feed.timeout:g} s")

    def _answer(self, asked: asyncio.Future[ModelResponse]) -> ModelResponse:
        """The inner model's answer, or its failure as ours: the client's timeout is the step's
        (``TurnTimedOut``), any other failure a ``ModelCallFailed``. Told apart here, where it is
        known the model raised it, from the SDK's and our own errors after."""
        try:
            return asked.result()
        except APITimeoutError:
            raise TurnTimedOut(
                f"model turn timed out after {settings.MODEL_TIMEOUT:g} s (MODEL_TIMEOUT)"
            ) from None
        except Exception as exc:
            raise ModelCallFailed(f"{type(exc).__name__}: {exc}") from None

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("durable agent runs do not stream")


_POLL = 0.05
_USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "total_tokens")


def _call_ids(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    return [
        str(item.get("call_id"))
        for item in items
        if isinstance(item, Mapping) and item.get("type") == "function_call"
    ]
