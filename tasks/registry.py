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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, StringConstraints

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
    dispatch step whose effect this one undoes.
    """

    connector: str = ""
    effect: Callable[[Facts], dict[str, Any]] = lambda facts: {}
    output: str = ""
    on_rejected: str = ""
    compensates: str = ""
    approval: str = ""  # the RequestApproval step whose approval this effect needs

    def targets(self) -> set[str]:
        return {self.next, self.on_rejected, self.compensates, self.approval}


@dataclass(frozen=True)
class Complete(Step):
    """Finish; ``outcome`` picks the facts the terminal outcome reports."""

    outcome: tuple[str, ...] = ()


@dataclass(frozen=True)
class Fail(Step):
    reason: str = ""


AnyStep = TypeVar("AnyStep", bound=Step)


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

    def __post_init__(self) -> None:
        names = [step.name for step in self.steps]
        if len(names) != len(set(names)):
            raise ValueError(f"{self.name}: duplicate step names")
        targets = set().union(*(step.targets() for step in self.steps), {self.replan_step}) - {""}
        unknown = targets - set(names)
        if unknown:
            raise ValueError(f"{self.name}: steps lead to unknown steps {sorted(unknown)}")

    @property
    def first_step(self) -> str:
        return self.steps[0].name

    def step(self, name: str) -> Step | None:
        return next((step for step in self.steps if step.name == name), None)

    def step_as(self, name: str, kind: type[AnyStep]) -> AnyStep:
        """The step ``name``, which must be a ``kind`` (an approval's action step is a ``Dispatch``).

        Raises ``LookupError`` when there is no such step or it is of another kind.
        """
        found = self.step(name)
        if not isinstance(found, kind):
            raise LookupError(f"{self.name}: no {kind.__name__} step named {name!r}")
        return found

    def backoff_for(self, attempt: int) -> timedelta:
        factor: int = 2 ** max(attempt - 1, 0)  # int ** int is typed Any (a negative power is a float)
        return self.backoff * factor


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


def scripts() -> dict[str, Callable[[Facts], str]]:
    """Every registered type's scripted answers, by prompt id."""
    return {prompt: script for kind in _REGISTRY.values() for prompt, script in kind.scripts.items()}
