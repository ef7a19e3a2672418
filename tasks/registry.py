"""The step DSL and the registry of task types (the types themselves live in ``workflows/``).

A task type names its input model, its steps (by name, each saying which step
comes next) and its policies: how many attempts a transient failure gets, what
a policy change during a wait means, what an expired wait does. The engine
(``runtime.engine``) interprets the steps; nothing here does I/O.

Steps are written to be safe to run again from their checkpoint: evidence is
re-read, model turns are recomputed, and a wait whose answer is already among
the accepted facts is not entered twice.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, StringConstraints

from audit import sealing
from ledger.policy import MoneyPolicy
from tasks.backoff import capped_backoff

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Facts = Mapping[str, Any]


# --- steps -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    next: str = ""

    def targets(self) -> set[str]:
        """Names of the steps this one can lead to or refers to."""
        return {self.next}


@dataclass(frozen=True)
class ReadEvidence(Step):
    """Read a record from ``system``; keep its reference and the facts named in ``facts``."""

    system: str = ""
    record_from: str = ""  # the fact holding the record id
    facts: Mapping[str, str] = field(default_factory=dict)  # record field -> fact name


@dataclass(frozen=True)
class ModelTurn(Step):
    """Ask the model; its answer becomes fact ``output`` and picks the next step by ``routes``."""

    prompt_id: str = ""
    instructions: str = ""
    output: str = ""
    routes: Mapping[str, str] = field(default_factory=dict)  # answer -> next step ("" = self.next)
    # A turn still unanswered after this long is abandoned and retried after a backoff
    # (``step_timed_out``, not a failed attempt's ``attempt_failed``). None: the model's own limit.
    timeout: timedelta | None = None

    def targets(self) -> set[str]:
        return {self.next, *self.routes.values()}


@dataclass(frozen=True)
class RequestInput(Step):
    """Ask a person; their answer becomes fact ``answer``."""

    question: str = ""
    answer: str = ""
    timeout: timedelta = timedelta(days=2)


@dataclass(frozen=True)
class AwaitExternal(Step):
    """Wait for an external event of ``event_type``; its payload field ``value`` becomes fact ``fact``."""

    event_type: str = ""
    fact: str = ""
    value: str = "value"
    timeout: timedelta = timedelta(days=7)


@dataclass(frozen=True)
class RequestApproval(Step):
    """Ask a person with ``approver_role`` to authorize the effect of ``action_step``.

    The request is bound to a digest of that effect as the facts stand now.
    Approval goes on to ``next``; rejection to ``on_rejected``.
    """

    action_step: str = ""
    reason: str = ""
    approver_role: str = "approver"
    on_rejected: str = ""
    timeout: timedelta = timedelta(days=1)

    def targets(self) -> set[str]:
        return {self.next, self.action_step, self.on_rejected}


@dataclass(frozen=True)
class Dispatch(Step):
    """Perform a side effect through the ledger: intent first, then one send per claim.

    ``effect`` builds the request from the accepted facts; the authoritative
    system's reference becomes fact ``output``. A definite refusal goes to
    ``on_rejected`` (or fails the task). ``compensates`` names the earlier
    dispatch step whose effect this one undoes. ``money`` declares the money
    policy of an effect that moves money (``ledger.policy``): when it finds
    something (a limit, a running total, an earlier effect for the same business
    reference), the effect waits for ``approval``; the request shows why.
    """

    connector: str = ""
    effect: Callable[[Facts], dict[str, Any]] = lambda facts: {}
    output: str = ""
    on_rejected: str = ""
    compensates: str = ""
    approval: str = ""  # the RequestApproval step whose approval this effect needs
    # Keys of the effect that carry sensitive facts: sealed in the ledger row (``audit.sealing``),
    # opened only to send it. The task type checks at registration that none is forgotten.
    sensitive: frozenset[str] = frozenset()
    # Money policy (``ledger.money.MoneyPolicy``): limits per currency, running totals per requester
    # and per API token, the business reference. With one, the effect needs ``approval`` only when
    # the policy finds something; without, always (when ``approval`` is named).
    money: MoneyPolicy | None = None
    # What else an approval of this effect is bound to (its digest covers it): an agent's tool call
    # names the agent, the tool and the call (``AgentRun``). Empty for a workflow's own steps.
    binds: Mapping[str, str] = field(default_factory=dict)
    # Why the task's facts do not vouch for this effect ("" when they do): an agent's call of a tool
    # with an ``EvidenceBinding``. Checked when the call's step is built and before each send.
    unbound: Callable[[Facts], str] | None = None

    def __post_init__(self) -> None:
        if self.money is not None and not self.approval:
            raise ValueError(f"{self.name}: a money policy needs the approval step that asks")

    def targets(self) -> set[str]:
        return {self.next, self.on_rejected, self.compensates, self.approval}


@dataclass(frozen=True)
class StartChildren(Step):
    """Start child tasks and wait (``waiting_children``) until every one has ended.

    ``children`` builds one spec per child from the accepted facts: ``task_type``,
    ``objective`` and ``input``. Once all have ended, facts ``<output>_completed``
    and ``<output>_not_completed`` count them; the task goes on to ``next`` when
    every child completed, else to ``on_incomplete`` (or fails, reason
    ``children_incomplete``). ``timeout`` bounds the wait; what an expired wait does
    is the type's ``on_wait_expiry``. The children are canceled with the parent.
    """

    children: Callable[[Facts], list[dict[str, Any]]] = lambda facts: []
    output: str = "children"
    on_incomplete: str = ""
    timeout: timedelta = timedelta(days=1)

    def targets(self) -> set[str]:
        return {self.next, self.on_incomplete}


# --- agents: a run of an SDK agent as one step, each of its tool calls a step of its own ----------------

# The name of the steps a tool call becomes: ``<tool>#<call>`` performs it (a ``Dispatch``),
# ``<tool>#<call>:approve`` asks for it (a ``RequestApproval``); the call's arguments are the facts
# ``<tool>#<call>.<argument>``. ``<call>`` is the model's call id when it is short and plain, else a
# digest of it (``call_key``). Steps, actions and approvals keyed by these names are the call's own.
CALL_MARK = "#"
APPROVE_SUFFIX = ":approve"
_PLAIN_CALL = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def call_key(call_id: str) -> str:
    """``call_id`` as it appears in step names: itself when short and plain, else a digest of it."""
    if _PLAIN_CALL.match(call_id):
        return call_id
    return "h" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def call_step(tool: str, call_id: str) -> str:
    """The name of the ``Dispatch`` step that performs the model's call ``call_id`` of ``tool``."""
    return f"{tool}{CALL_MARK}{call_key(call_id)}"


@dataclass(frozen=True)
class AgentEvidence:
    """A read-only tool: each call reads record ``<argument record_from>`` from ``system`` and keeps
    its reference and the facts named in ``facts``, as a ``ReadEvidence`` step does; what the model
    is told is those facts (sensitive ones masked)."""

    tool: str
    system: str
    record_from: str
    facts: Mapping[str, str] = field(default_factory=dict)  # record field -> fact name


def read_fact(tool: str) -> str:
    """The fact holding the id of the record the ``AgentEvidence`` tool ``tool`` read last in the task:
    the record whose facts the task's facts (``AgentEvidence.facts``) are now."""
    return f"{tool}:record"


# The reason code of an agent's call whose arguments its task's evidence does not vouch for
# (``EvidenceBinding``): the call is refused at its step (the model is told) and, should an intent
# reach the ledger anyway, withheld at send time (``runtime.dispatch``), the task quarantined.
ARGUMENT_UNBOUND = "agent_argument_unbound"


@dataclass(frozen=True)
class EvidenceBinding:
    """What an ``AgentEffect`` call's arguments must agree with: the evidence this same task read.

    The model's arguments are a request, not authority. ``record`` names the argument that must be
    the id of the record the ``AgentEvidence`` tool ``evidence`` read last in this task (so the
    task's facts are that record's; an effect builder that takes a card or an address from the facts
    takes that record's). ``at_most``: argument -> fact of that record, a positive finite decimal no
    larger than the fact; ``equal``: argument -> fact, the same value. A fact the record did not
    state vouches for nothing: the call is refused.
    """

    evidence: str
    record: str
    at_most: Mapping[str, str] = field(default_factory=dict)
    equal: Mapping[str, str] = field(default_factory=dict)

    def facts(self) -> set[str]:
        """The record's facts this binding compares with."""
        return {*self.at_most.values(), *self.equal.values()}

    def unbound(self, arguments: Facts, facts: Facts) -> str:
        """Why ``arguments`` are not vouched for by the evidence among ``facts``; "" when they are."""
        wanted = arguments.get(self.record)
        read = facts.get(read_fact(self.evidence))
        if wanted in (None, "") or read in (None, "") or str(wanted) != str(read):
            last = f"the last one read is {read!r}" if read not in (None, "") else "it read none"
            return (
                f"{self.record} {wanted!r} is not the record this task read with {self.evidence} ({last}):"
                f" look it up with {self.evidence} first"
            )
        for argument, fact in self.at_most.items():
            amount, limit = _finite(arguments.get(argument)), _finite(facts.get(fact))
            if amount is None or amount <= 0:
                return f"{argument} {arguments.get(argument)!r} is not a positive amount"
            if limit is None:
                return f"record {read!r} states no {fact} to check {argument} against"
            if amount > limit:
                return f"{argument} {amount} is more than {fact} {limit} of record {read!r}"
        for argument, fact in self.equal.items():
            value, stated = arguments.get(argument), facts.get(fact)
            if stated in (None, ""):
                return f"record {read!r} states no {fact} to check {argument} against"
            if str(value) != str(stated):
                return f"{argument} {value!r} is not {fact} {stated!r} of record {read!r}"
        return ""


def _finite(value: Any) -> Decimal | None:
    """``value`` as a finite Decimal (facts and arguments hold amounts as text), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value).strip())
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


@dataclass(frozen=True)
class AgentEffect:
    """A tool with a side effect: each call is a ledger action through ``connector``.

    ``effect`` builds the request from the call's arguments and the task's facts (an address the
    model must not choose comes from the facts). ``approval``: every call needs an approver;
    ``money``: calls the policy finds something about do (its amount, currency and reference are
    argument names). ``binding``: the arguments must agree with evidence this task read
    (``EvidenceBinding``), checked when the call's step is built and again before the send.
    The tool's own function is never run: the ledger performs the call.
    """

    tool: str
    connector: str
    effect: Callable[[Facts, Facts], dict[str, Any]]  # (arguments, facts) -> request
    sensitive: frozenset[str] = frozenset()
    money: MoneyPolicy | None = None
    approval: bool = False
    approver_role: str = "approver"
    reason: str = ""
    timeout: timedelta = timedelta(days=1)
    binding: EvidenceBinding | None = None

    def needs_approval(self, arguments: Facts) -> bool:
        """Whether a call with ``arguments`` must wait for an approver before its intent, by this
        declaration alone (the money table, no ledger read): what makes the SDK pause the run.
        Arguments it cannot judge (a value no arithmetic takes) need one: the runtime then refuses
        the call before anyone is asked."""
        try:
            return self.approval or (
                self.money is not None and (self.money.always or bool(self.money.over_limit(arguments)))
            )
        except (ArithmeticError, TypeError, ValueError):
            return True


AgentTool = AgentEvidence | AgentEffect


@dataclass(frozen=True)
class AgentRun(Step):
    """Run an SDK agent (``runtime.sdk``): each model turn is a transition of this step, each tool
    call a step of its own (``AgentEffect``: a ledger action, with its approval; ``AgentEvidence``:
    recorded evidence), after which the run goes on here; its final answer becomes fact ``output``.

    ``agent`` is the SDK's ``Agent`` (opaque to the kernel, which never imports the SDK), or where
    one lives, ``"module:attribute"``: imported when the run first needs it (``sdk_agent``), so that
    a process that never runs the agent (the web, a worker of other types) never loads the SDK.
    Every function tool of it and of the agents it hands off to must be declared in ``tools``.
    """

    agent: Any = None
    tools: tuple[AgentTool, ...] = ()
    output: str = "agent_output"
    # The facts the agent is given as its first message (JSON; sensitive ones masked, as for a ModelTurn).
    brief: tuple[str, ...] = ()
    max_turns: int = 10
    timeout: timedelta | None = None  # per model turn, as ModelTurn.timeout
    # Conversation memory (``runtime.sdk.session``): the fact whose value names the conversation (a
    # customer's address, say; stored as a digest of it). The run starts from what the conversation
    # held when it began and adds what it said once it answers. "": no memory.
    session: str = ""
    memory_items: int = 40  # at most this many of the conversation's latest items, from a user's message on

    def __post_init__(self) -> None:
        if isinstance(self.agent, str):
            module, colon, attribute = self.agent.partition(":")
            if not (module and colon and attribute.isidentifier()):
                raise ValueError(f"{self.name}: agent {self.agent!r} is no 'module:attribute'")
            return  # checked once imported (``sdk_agent``)
        self._check_tools(self.agent)

    def sdk_agent(self) -> Any:
        """The agent itself: ``agent``, or what it names, imported (and its tools checked) once."""
        if not isinstance(self.agent, str):
            return self.agent
        found = self.__dict__.get("_imported")
        if found is None:
            module, _, attribute = self.agent.partition(":")
            found = getattr(importlib.import_module(module), attribute)
            self._check_tools(found)
            object.__setattr__(self, "_imported", found)  # frozen: a cache, not a field
        return found

    def _check_tools(self, agent: Any) -> None:
        # Read by shape (the kernel does not import the SDK): every function tool of the agent and of
        # the agents it hands off to must be declared, and every declaration must name one of them.
        found = _function_tools(agent)
        declared = {tool.tool for tool in self.tools}
        if found - declared:
            raise ValueError(
                f"{self.name}: the agent's tools {sorted(found - declared)} are not declared: each must be"
                " an AgentEffect or an AgentEvidence, so the ledger sees what it does"
            )
        if declared - found:
            raise ValueError(f"{self.name}: declared tools {sorted(declared - found)} are not the agent's")
        for tool in self.tools:
            binding = tool.binding if isinstance(tool, AgentEffect) else None
            if binding is None:
                continue
            # A binding to a tool the run lacks (a deployment that dropped it) stands: with no read of
            # it in any task, every call is refused. One that cannot compare what it names is a mistake.
            source = self.tool(binding.evidence)
            if source is None:
                continue
            if not isinstance(source, AgentEvidence):
                raise ValueError(
                    f"{self.name}: {tool.tool}'s binding names {binding.evidence!r}, no AgentEvidence"
                )
            unkept = binding.facts() - set(source.facts.values())
            if unkept:
                raise ValueError(
                    f"{self.name}: {tool.tool}'s binding compares with {sorted(unkept)}, which"
                    f" {source.tool} does not keep"
                )

    def tool(self, name: str) -> AgentTool | None:
        return next((tool for tool in self.tools if tool.tool == name), None)

    def call_steps(self, name: str) -> Step | None:
        """The step ``name`` when it is one of this run's tool calls (see ``CALL_MARK``), else None."""
        base, approve = (
            (name[: -len(APPROVE_SUFFIX)], True) if name.endswith(APPROVE_SUFFIX) else (name, False)
        )
        tool_name, mark, call = base.partition(CALL_MARK)
        tool = self.tool(tool_name)
        if not mark or not isinstance(tool, AgentEffect) or not _PLAIN_CALL.match(call):
            return None
        prefix = f"{base}."
        asks = tool.approval or tool.money is not None
        if approve:
            return RequestApproval(
                f"{base}{APPROVE_SUFFIX}",
                next=base,
                action_step=base,
                reason=tool.reason or f"{tool.tool} needs an approver's consent",
                approver_role=tool.approver_role,
                on_rejected=self.name,
                timeout=tool.timeout,
            )
        money = tool.money
        if money is not None:
            money = dataclasses.replace(
                money,
                amount=prefix + money.amount,
                currency=prefix + money.currency,
                reference=prefix + money.reference if money.reference else "",
            )
        return Dispatch(
            base,
            next=self.name,
            connector=tool.connector,
            effect=functools.partial(_call_effect, tool, prefix),
            on_rejected=self.name,
            approval=f"{base}{APPROVE_SUFFIX}" if asks else "",
            sensitive=tool.sensitive,
            money=money,
            binds={"agent": self.agent_name, "tool": tool.tool, "call": call},
            unbound=functools.partial(_call_unbound, tool.binding, prefix) if tool.binding else None,
        )

    @property
    def agent_name(self) -> str:
        return str(getattr(self.sdk_agent(), "name", "") or "")


def _function_tools(agent: Any) -> set[str]:
    """The names of the function tools (``on_invoke_tool``) of ``agent`` and of every agent it can hand
    off to (``handoffs``), read by attribute."""
    names: set[str] = set()
    seen: list[Any] = []
    pending = [agent] if agent is not None else []
    while pending:
        each = pending.pop()
        if any(each is earlier for earlier in seen):
            continue
        seen.append(each)
        names |= {str(tool.name) for tool in getattr(each, "tools", ()) if hasattr(tool, "on_invoke_tool")}
        pending.extend(getattr(each, "handoffs", ()))
    return names


def call_arguments(prefix: str, facts: Facts) -> dict[str, Any]:
    """The arguments of the call whose facts start with ``prefix`` (``<tool>#<call>.``)."""
    return {name[len(prefix) :]: value for name, value in facts.items() if name.startswith(prefix)}


def _call_effect(tool: AgentEffect, prefix: str, facts: Facts) -> dict[str, Any]:
    return tool.effect(call_arguments(prefix, facts), facts)


def _call_unbound(binding: EvidenceBinding, prefix: str, facts: Facts) -> str:
    return binding.unbound(call_arguments(prefix, facts), facts)


@dataclass(frozen=True)
class Complete(Step):
    """Finish; ``outcome`` picks the facts the terminal outcome reports."""

    outcome: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fail(Step):
    reason: str = ""


AnyStep = TypeVar("AnyStep", bound=Step)


class _StandIn(dict[str, Any]):
    """Facts for probing an effect builder: the given markers, "1" for any other name it reads."""

    def __missing__(self, key: str) -> str:
        return "1"


# --- task types ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskType:
    name: str
    description: str
    input_model: type[BaseModel]
    steps: tuple[Step, ...]
    model_id: str = "scripted-v1"
    prompt_id: str = ""
    toolset_id: str = ""
    max_attempts: int = 5
    backoff: timedelta = timedelta(seconds=5)  # doubled per attempt
    backoff_max: timedelta = timedelta(minutes=5)  # however many attempts, no wait is longer
    # What a changed policy version found on resume means: start planning again
    # from ``replan_step``, or carry on.
    on_policy_change: Literal["replan", "proceed"] = "replan"
    replan_step: str = ""
    # What an expired wait does: revalidate (and so ask again) or expire the task.
    on_wait_expiry: Literal["expire", "revalidate"] = "expire"
    # Material facts of an approval: a change after the decision either voids it
    # ("invalidate": ask again), needs fresh evidence first ("refresh"), or does
    # not matter ("immaterial"). A policy version change always invalidates.
    material_facts: Mapping[str, Literal["invalidate", "refresh", "immaterial"]] = field(default_factory=dict)
    # The scripted model's answer per prompt id (the demo's and the tests' deterministic model).
    scripts: Mapping[str, Callable[[Facts], str]] = field(default_factory=dict)
    # Derives the first facts from the accepted input (by default: its scalar fields).
    initial_facts: Callable[[Mapping[str, Any]], dict[str, Any]] = lambda accepted: {
        key: value for key, value in accepted.items() if isinstance(value, str | int | float | bool | None)
    }
    # Facts and input fields holding personal or payment data (a card, an e-mail, a free-text answer):
    # sealed in every checkpoint, masked on every page and API answer until someone entitled reveals
    # one, and masked before a model sees the facts — except those named in ``model_sees``.
    # The one declaration of what is sensitive (``audit.sealing``); each Dispatch names its effect keys.
    sensitive: frozenset[str] = frozenset()
    model_sees: frozenset[str] = frozenset()
    # Input fields an operator may change when resuming an ended task from one of its checkpoints
    # (``tasks.forks``); a type that names none keeps its input as it was submitted.
    fork_editable: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        names = [step.name for step in self.steps]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.name}: duplicate step names")
        targets = set().union(*(step.targets() for step in self.steps), {self.replan_step}) - {""}
        unknown = targets - set(names)
        if unknown:
            raise ValueError(f"{self.name}: steps lead to unknown steps {sorted(unknown)}")
        unknown_fields = self.fork_editable - set(self.input_model.model_fields)
        if unknown_fields:
            raise ValueError(f"{self.name}: fork_editable names no input field: {sorted(unknown_fields)}")
        if not self.model_sees <= self.sensitive:
            raise ValueError(f"{self.name}: model_sees names facts not marked sensitive")
        tools = [tool.tool for run in self.agent_runs for tool in run.tools]
        if len(tools) != len(set(tools)) or any(not _PLAIN_CALL.match(name) for name in tools):
            raise ValueError(f"{self.name}: agent tool names must be unique and plain ({tools})")
        leaks = self._unsealed_effect_keys()
        if leaks:
            raise ValueError(
                f"{self.name}: effect keys {leaks} carry sensitive facts: mark them in their Dispatch's "
                "sensitive"
            )

    def _unsealed_effect_keys(self) -> list[str]:
        """Effect keys a Dispatch fills from a sensitive fact without marking them sensitive.

        Each builder runs once on stand-in facts (a marker per sensitive fact, "1" for any other);
        a builder that cannot run on stand-ins is not checked, and its declaration stands.
        """
        if not self.sensitive:
            return []
        markers = {name: f"@@sensitive:{name}@@" for name in self.sensitive}
        leaks = []
        builders: list[tuple[str, frozenset[str], Callable[[], dict[str, Any]]]] = [
            (step.name, step.sensitive, functools.partial(step.effect, _StandIn(markers)))
            for step in self.steps
            if isinstance(step, Dispatch)
        ]
        builders += [
            (tool.tool, tool.sensitive, functools.partial(tool.effect, _StandIn(), _StandIn(markers)))
            for run in self.agent_runs
            for tool in run.tools
            if isinstance(tool, AgentEffect)
        ]
        for name, sensitive, build in builders:
            try:
                effect = build()
            except Exception:  # a builder doing arithmetic on real facts: see above
                continue
            for key, value in effect.items():
                text = value if isinstance(value, str) else json.dumps(value, default=str)
                if key not in sensitive and any(marker in text for marker in markers.values()):
                    leaks.append(f"{name}.{key}")
        return leaks

    @property
    def outcome_fields(self) -> frozenset[str]:
        """Facts a completed task reports in its outcome (the ``Complete`` steps' names)."""
        return frozenset().union(*(step.outcome for step in self.steps if isinstance(step, Complete)))

    def uses_prompt(self, prompt_id: str) -> bool:
        return prompt_id == self.prompt_id or any(
            isinstance(step, ModelTurn) and step.prompt_id == prompt_id for step in self.steps
        )

    @property
    def first_step(self) -> str:
        return self.steps[0].name

    def step(self, name: str) -> Step | None:
        """The step ``name``: one of ``steps``, or a tool call of an ``AgentRun`` (its own steps)."""
        found = next((step for step in self.steps if step.name == name), None)
        if found is None and CALL_MARK in name:
            for run in self.agent_runs:
                found = run.call_steps(name)
                if found is not None:
                    break
        return found

    @property
    def agent_runs(self) -> tuple[AgentRun, ...]:
        return tuple(step for step in self.steps if isinstance(step, AgentRun))

    def step_as(self, name: str, kind: type[AnyStep]) -> AnyStep:
        """The step ``name``, which must be a ``kind`` (an approval's action step is a ``Dispatch``).

        Raises ``LookupError`` when there is no such step or it is of another kind.
        """
        found = self.step(name)
        if not isinstance(found, kind):
            raise LookupError(f"{self.name}: no {kind.__name__} step named {name!r}")
        return found

    def backoff_for(self, attempt: int) -> timedelta:
        """The wait after failed attempt ``attempt``: ``backoff``, doubled for each attempt after the
        first, at most ``backoff_max``."""
        base, cap = self.backoff.total_seconds(), self.backoff_max.total_seconds()
        return timedelta(seconds=capped_backoff(base, attempt - 1, cap))


_REGISTRY: dict[str, TaskType] = {}


def register(task_type: TaskType) -> TaskType:
    if task_type.name in _REGISTRY:
        raise ValueError(f"task type {task_type.name!r} is already registered")
    _REGISTRY[task_type.name] = task_type
    return task_type


def get(name: str) -> TaskType:
    return _REGISTRY[name]


def names() -> list[str]:
    return sorted(_REGISTRY)


def starts_children(task_type: str) -> bool:
    """Whether ``task_type`` has a ``StartChildren`` step (False for a type this code lacks)."""
    kind = _REGISTRY.get(task_type)
    return kind is not None and any(isinstance(step, StartChildren) for step in kind.steps)


def sensitive_fields(task_type: str) -> frozenset[str]:
    """The facts and input fields ``task_type`` marks sensitive (none for a type this code lacks)."""
    kind = _REGISTRY.get(task_type)
    return kind.sensitive if kind is not None else frozenset()


def sensitive_effect_keys(task_type: str, step: str) -> frozenset[str]:
    """The effect keys the Dispatch ``step`` of ``task_type`` marks sensitive."""
    kind = _REGISTRY.get(task_type)
    found = kind.step(step) if kind is not None else None
    return found.sensitive if isinstance(found, Dispatch) else frozenset()


def facts_for_model(prompt_id: str, facts: Facts) -> dict[str, Any]:
    """``facts`` as a model answering ``prompt_id`` may see them: each sensitive fact masked, unless the
    task type using the prompt declares the model needs it (``model_sees``). A prompt no registered
    type uses gets every name any type marks sensitive masked."""
    users = [kind for kind in _REGISTRY.values() if kind.uses_prompt(prompt_id)]
    if users:
        hidden = frozenset().union(*(kind.sensitive - kind.model_sees for kind in users))
    else:
        hidden = frozenset().union(*(kind.sensitive for kind in _REGISTRY.values()))
    return {
        name: sealing.MODEL_MASK if name in hidden and value not in (None, "") else value
        for name, value in facts.items()
    }


def scripts() -> dict[str, Callable[[Facts], str]]:
    """Every registered type's scripted answers, by prompt id."""
    return {prompt: script for kind in _REGISTRY.values() for prompt, script in kind.scripts.items()}
