"""The task types a caller can start, as a public contract: what ``/api/task-types/``, the console's
task-types page and the A2A agent card all show (one read, one shape).

A contract is derived from the registry (``tasks.registry``) and the policy version in force
(``tasks.models.Policy``); nothing here is stored. ``version`` is a digest of everything else the
contract says (input schema, sensitive fields, steps, approvals and their money limits, policy
version), so it changes whenever any of them does and a caller can cache a contract by it.

The input schema is the input model's own JSON Schema (draft 2020-12, pydantic's
``model_json_schema``), so what the schema refuses the task create API refuses too. Each input
field the task type marks sensitive carries ``"writeOnly": true`` (a caller sends it; no answer
shows it back unmasked) and ``"x-sensitive": true`` (sealed at rest, masked on every page and API
answer, never shown to a model): validators ignore both.

Who sees the contracts: anyone holding a role in some tenant (``visible_to``); task types are the
deployment's, so a caller's tenant does not narrow the list today. Reading them costs one query for
the caller's roles (cached on the user) and one for the policy versions in force.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings

from ledger.policy import MoneyPolicy
from tasks import registry
from tasks.models import Policy
from tenancy.selectors import tenant_ids_for

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SENSITIVE_MARK = "x-sensitive"  # our annotation on a sensitive field's schema (beside ``writeOnly``)


@dataclass(frozen=True)
class StepContract:
    name: str
    kind: str  # the step's class name: ReadEvidence, ModelTurn, RequestInput, Dispatch, AgentRun, …
    next: str = ""  # the step it goes on to ("" for an ending step)
    detail: str = ""  # what it does, in a few words ("reads orders", "asks: Which item was damaged?")


@dataclass(frozen=True)
class ApprovalContract:
    """An effect that needs an approver: always, or only when its money policy finds something."""

    step: str  # the Dispatch step (an agent's tool: the tool's name)
    approval_step: str
    approver_role: str
    always: bool  # False: only above ``limits`` (or on a running total, a repeated reference)
    limits: dict[str, dict[str, str]]  # currency -> {"each": "100", "total": "1000"}
    # An agent's tool: the AgentRun step whose calls these are ("" for a workflow's own Dispatch).
    # Each call of the tool is a step of its own, ``<tool>#<call>``, asked for at ``approval_step``
    # with ``<call>`` standing for the call.
    agent_step: str = ""
    connector: str = ""  # the system the effect goes to (payments, email, …)
    expires_after_seconds: int = 0  # how long a request waits for a decision before it expires
    reason: str = ""  # the policy reason the approver reads
    # The money policy's running total: ``total`` counts over this window, per requester and per
    # API token (0 when the effect has no money policy).
    window_seconds: int = 0
    reference_kind: str = ""  # an earlier effect for the same business reference (an order) asks too
    on_duplicate: str = ""  # "approve" (ask) or "refuse" such a repeat ("" without a reference)
    summary: str = ""  # when it asks, in one sentence (what the console shows)


@dataclass(frozen=True)
class InputField:
    """One field of the input, read from the schema (for people; the schema is the contract)."""

    name: str
    type: str  # "string", "number or string", "array of string", …
    required: bool
    sensitive: bool
    default: str = ""  # the default as JSON ("" when the field has none)
    rules: tuple[str, ...] = ()  # its constraints in words ("at most 200 characters", "matches ^[A-Z]{3}$")


@dataclass(frozen=True)
class TaskTypeContract:
    name: str
    description: str
    version: str
    policy_version: str
    input_schema: dict[str, Any]  # JSON Schema (draft 2020-12) of the input, from the input model
    sensitive_fields: tuple[str, ...]  # the input fields marked sensitive (as in ``input_schema``)
    steps: tuple[StepContract, ...]
    approvals: tuple[ApprovalContract, ...]
    input_fields: tuple[InputField, ...] = ()
    # Facts the task derives (a card read as evidence, an answer it asks for) that are sealed and
    # masked like the sensitive input fields.
    sensitive_facts: tuple[str, ...] = ()


def visible_to(user: Any) -> bool:
    """Whether ``user`` may read the task types: a role in some tenant (one query, cached on the user)."""
    return bool(tenant_ids_for(user))


def contracts() -> list[TaskTypeContract]:
    """Every registered type, by name (one query: the policy versions in force)."""
    policies = dict(Policy.objects.values_list("task_type", "version"))
    return [_contract(registry.get(name), policies.get(name)) for name in sorted(registry.names())]


def contract(name: str) -> TaskTypeContract | None:
    """The type ``name`` (one query), or None when no such type is registered."""
    if name not in registry.names():
        return None
    policy = Policy.objects.filter(task_type=name).values_list("version", flat=True).first()
    return _contract(registry.get(name), policy)


def _contract(kind: registry.TaskType, policy: str | None) -> TaskTypeContract:
    schema = input_schema(kind)
    sensitive = tuple(sorted(kind.sensitive & set(schema.get("properties", {}))))
    draft = TaskTypeContract(
        name=kind.name,
        description=kind.description,
        version="",
        policy_version=policy or settings.DEFAULT_POLICY_VERSION,
        input_schema=schema,
        sensitive_fields=sensitive,
        steps=tuple(_step(step) for step in kind.steps),
        approvals=approvals_of(kind),
        input_fields=input_fields(schema),
        sensitive_facts=tuple(sorted(kind.sensitive - set(sensitive))),
    )
    shape = {key: value for key, value in dataclasses.asdict(draft).items() if key != "version"}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True, separators=(",", ":")).encode())
    return dataclasses.replace(draft, version=digest.hexdigest()[:16])


# --- the input schema ---------------------------------------------------------------------------------


def input_schema(kind: registry.TaskType) -> dict[str, Any]:
    """The input model's JSON Schema, its dialect named, each sensitive field marked (module docstring)."""
    schema = copy.deepcopy(kind.input_model.model_json_schema())
    for name, field_schema in schema.get("properties", {}).items():
        if name in kind.sensitive:
            field_schema["writeOnly"] = True
            field_schema[SENSITIVE_MARK] = True
    return {"$schema": JSON_SCHEMA_DIALECT, **schema}


def input_fields(schema: Mapping[str, Any]) -> tuple[InputField, ...]:
    required = set(schema.get("required", ()))
    defs = schema.get("$defs", {})
    return tuple(
        InputField(
            name=name,
            type=_type_of(field_schema, defs),
            required=name in required,
            sensitive=bool(field_schema.get(SENSITIVE_MARK)),
            default=json.dumps(field_schema["default"]) if "default" in field_schema else "",
            rules=tuple(_rules(field_schema, defs)),
        )
        for name, field_schema in schema.get("properties", {}).items()
    )


def _resolved(field_schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = field_schema.get("$ref", "")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found = defs.get(ref.removeprefix("#/$defs/"))
        if isinstance(found, Mapping):
            return found
    return field_schema


def _type_of(field_schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    field_schema = _resolved(field_schema, defs)
    if "enum" in field_schema:
        return "one of " + ", ".join(json.dumps(value) for value in field_schema["enum"])
    if "const" in field_schema:
        return json.dumps(field_schema["const"])
    branches = field_schema.get("anyOf") or field_schema.get("oneOf")
    if branches:
        names = [_type_of(branch, defs) for branch in branches]
        return " or ".join(dict.fromkeys(names))  # in order, once each
    kind = field_schema.get("type")
    if kind == "array":
        items = field_schema.get("items")
        return f"array of {_type_of(items, defs)}" if isinstance(items, Mapping) else "array"
    if isinstance(kind, list):
        return " or ".join(str(each) for each in kind)
    return str(kind) if kind else "any"


# Constraint keyword -> how a person reads it (singular, plural).
_RULES = {
    "minLength": ("at least {} character", "at least {} characters"),
    "maxLength": ("at most {} character", "at most {} characters"),
    "pattern": ("matches {}", "matches {}"),
    "format": ("format {}", "format {}"),
    "minimum": ("at least {}", "at least {}"),
    "exclusiveMinimum": ("above {}", "above {}"),
    "maximum": ("at most {}", "at most {}"),
    "exclusiveMaximum": ("below {}", "below {}"),
    "minItems": ("at least {} item", "at least {} items"),
    "maxItems": ("at most {} item", "at most {} items"),
}


def _rules(field_schema: Mapping[str, Any], defs: Mapping[str, Any]) -> list[str]:
    field_schema = _resolved(field_schema, defs)
    rules = [
        (one if field_schema[word] == 1 else many).format(field_schema[word])
        for word, (one, many) in _RULES.items()
        if word in field_schema
    ]
    for branch in field_schema.get("anyOf") or field_schema.get("oneOf") or ():
        rules += [f"as {_type_of(branch, defs)}: {rule}" for rule in _rules(branch, defs)]
    items = field_schema.get("items")
    if isinstance(items, Mapping):
        rules += [f"each item {rule}" for rule in _rules(items, defs)]
    return rules


# --- steps and approvals ------------------------------------------------------------------------------


def _step(step: registry.Step) -> StepContract:
    return StepContract(step.name, type(step).__name__, next=step.next, detail=_detail(step))


def _detail(step: registry.Step) -> str:
    if isinstance(step, registry.ReadEvidence):
        return f"reads a record from {step.system}"
    if isinstance(step, registry.ModelTurn):
        return f"asks the model ({step.prompt_id})"
    if isinstance(step, registry.RequestInput):
        return f"asks a person: {step.question}"
    if isinstance(step, registry.AwaitExternal):
        return f"waits for the event {step.event_type}"
    if isinstance(step, registry.RequestApproval):
        return f"asks an {step.approver_role} to approve {step.action_step}"
    if isinstance(step, registry.Dispatch):
        undoes = f", undoing {step.compensates}" if step.compensates else ""
        return f"an effect through {step.connector}{undoes}"
    if isinstance(step, registry.StartChildren):
        return "starts child tasks and waits for them"
    if isinstance(step, registry.AgentRun):
        tools = ", ".join(tool.tool for tool in step.tools)
        return f"runs the agent {step.agent_name or step.name}" + (f" with tools {tools}" if tools else "")
    if isinstance(step, registry.Complete):
        return "completes the task"
    if isinstance(step, registry.Fail):
        return f"fails the task ({step.reason})" if step.reason else "fails the task"
    return ""


def approvals_of(kind: registry.TaskType) -> tuple[ApprovalContract, ...]:
    """Every effect of ``kind`` that asks an approver: each ``RequestApproval`` with the ``Dispatch``
    it authorizes, then each tool of an ``AgentRun`` that needs approval or has a money policy."""
    found = []
    for ask in kind.steps:
        if not isinstance(ask, registry.RequestApproval):
            continue
        effect = kind.step(ask.action_step)
        dispatch = effect if isinstance(effect, registry.Dispatch) else None
        money = dispatch.money if dispatch is not None else None
        found.append(
            _approval(
                step=ask.action_step,
                approval_step=ask.name,
                approver_role=ask.approver_role,
                money=money,
                asks_always=money is None or money.always,
                connector=dispatch.connector if dispatch is not None else "",
                timeout=ask.timeout,
                reason=ask.reason,
            )
        )
    for run in kind.agent_runs:
        for tool in run.tools:
            if not isinstance(tool, registry.AgentEffect) or not (tool.approval or tool.money):
                continue
            base = f"{tool.tool}{registry.CALL_MARK}<call>"
            found.append(
                _approval(
                    step=tool.tool,
                    approval_step=f"{base}{registry.APPROVE_SUFFIX}",
                    approver_role=tool.approver_role,
                    money=tool.money,
                    asks_always=tool.approval or (tool.money is not None and tool.money.always),
                    connector=tool.connector,
                    timeout=tool.timeout,
                    reason=tool.reason or f"{tool.tool} needs an approver's consent",
                    agent_step=run.name,
                )
            )
    return tuple(found)


def _approval(
    *,
    step: str,
    approval_step: str,
    approver_role: str,
    money: MoneyPolicy | None,
    asks_always: bool,
    connector: str,
    timeout: timedelta,
    reason: str,
    agent_step: str = "",
) -> ApprovalContract:
    limits = {
        currency: {"each": f"{limit.each:f}", "total": f"{limit.total:f}"}
        for currency, limit in sorted((money.limits if money else {}).items())
    }
    return ApprovalContract(
        step=step,
        approval_step=approval_step,
        approver_role=approver_role,
        always=asks_always,
        limits=limits,
        agent_step=agent_step,
        connector=connector,
        expires_after_seconds=int(timeout.total_seconds()),
        reason=reason,
        window_seconds=int(money.window.total_seconds()) if money else 0,
        reference_kind=money.reference_kind if money and money.reference else "",
        on_duplicate=money.on_duplicate if money and money.reference else "",
        summary=_summary(asks_always, money),
    )


def _summary(asks_always: bool, money: MoneyPolicy | None) -> str:
    """When the effect asks, in words; the numbers are ``limits`` (shown beside it)."""
    if money is None:
        return "Always needs an approver."
    window = duration(money.window)
    repeat = ""
    if money.reference:
        handled = "refused" if money.on_duplicate == "refuse" else "asked about"
        repeat = (
            f"; {_article(money.reference_kind)} {money.reference_kind} already {money.verb} is {handled}"
        )
    if asks_always:
        return (
            "Always needs an approver; the request also says when the amount is above its currency's"
            f" limit or the running total in {window} is passed{repeat}."
        )
    return (
        "Needs an approver above its currency's limit at once, past the running total in"
        f" {window} (per requester and per API token), in a currency not listed, or for an amount"
        f" that cannot be read{repeat}."
    )


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def duration(span: timedelta) -> str:
    """A span in words: "a day", "2 hours", "90 seconds" (the summaries' and the console's)."""
    seconds = int(span.total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            if count == 1:
                return "an hour" if unit == "hour" else f"a {unit}"
            return f"{count} {unit}s"
    return f"{seconds} seconds"
