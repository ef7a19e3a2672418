"""What an agent run is made of, named without the SDK: the id of its tool set and of its model.

Resume validation (``runtime.validation``) asks these of every ``AgentRun`` of a task type, and a
worker without the SDK installed must still be able to: so nothing here imports it. The agent is
read the way the SDK's objects are shaped (``tools`` with ``name`` and ``params_json_schema``,
``handoffs``, ``model``), as the kernel holds it: an opaque object.

- ``toolset_id``: a digest of the tools the run can call, as the model sees them (name and JSON
  schema) and as the ledger performs them (the declaration: connector or system, approval, money
  policy, sensitive keys). Any change a model or an approver could notice changes it; the order the
  tools are listed in does not. The agent step records it on each model turn (fact
  ``<run>:toolset``), so a task's checkpoint says which tool set its turns were planned with.
  It is not the type's declared ``toolset_id``: that is the name operators approve in
  ``RuntimeConfig`` rows and stays what it was; this one cannot be forgotten when a tool changes.
- ``model_id``: the model new turns of the run ask, as ``replay`` picks it (``MODEL_BACKEND``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from tasks import registry

PREFIX = "tools@sha256:"


def fact_name(run: registry.AgentRun) -> str:
    """The fact recording the tool set ``run``'s turns were planned with."""
    return f"{run.name}:toolset"


def toolset_id(run: registry.AgentRun) -> str:
    """``tools@sha256:<16 hex>`` over every function tool of ``run``'s agent (and the agents it
    hands off to), sorted by name, with each one's declaration."""
    entries = []
    for name, schema in sorted(agent_tools(run).items()):
        declared = run.tool(name)
        entries.append({"name": name, "schema": schema, "declared": _declaration(declared)})
    text = json.dumps(entries, sort_keys=True, separators=(",", ":"), default=str)
    return PREFIX + hashlib.sha256(text.encode()).hexdigest()[:16]


def agent_tools(run: registry.AgentRun) -> dict[str, Any]:
    """Tool name -> its JSON schema, for the agent and every agent it can hand off to."""
    found: dict[str, Any] = {}
    seen: list[Any] = []
    pending = [run.sdk_agent()]
    while pending:
        agent = pending.pop()
        if agent is None or any(agent is each for each in seen):
            continue
        seen.append(agent)
        for tool in getattr(agent, "tools", None) or ():
            name = getattr(tool, "name", None)
            if isinstance(name, str):
                found[name] = getattr(tool, "params_json_schema", None)
        pending.extend(getattr(agent, "handoffs", None) or ())
    return found


def _declaration(tool: registry.AgentTool | None) -> dict[str, Any]:
    if isinstance(tool, registry.AgentEvidence):
        return {"evidence": tool.system, "record_from": tool.record_from, "facts": dict(tool.facts)}
    if isinstance(tool, registry.AgentEffect):
        return {
            "effect": tool.connector,
            "approval": tool.approval,
            "approver_role": tool.approver_role,
            "money": tool.money is not None,
            "sensitive": sorted(tool.sensitive),
            # What its arguments are bound to (only when bound: an unbound tool's id is what it was).
            **({"binding": dataclasses.asdict(tool.binding)} if tool.binding is not None else {}),
        }
    return {}  # undeclared: the run refuses it (``agent_tool_undeclared``); the digest still counts it


def called_tools(facts: Mapping[str, Any]) -> set[str]:
    """The tools a run's recorded calls used: every call leaves its arguments (``<tool>#<call>.<arg>``)
    or its output (``<tool>#<call>:output``) among the facts."""
    return {name.partition(registry.CALL_MARK)[0] for name in facts if registry.CALL_MARK in name}


def model_id(run: registry.AgentRun) -> str:
    """The id of the model ``run``'s next turn asks (as ``replay._model_for`` chooses it)."""
    if settings.MODEL_BACKEND == "openai":
        return f"openai-compatible:{settings.MODEL_NAME}"
    own = getattr(run.sdk_agent(), "model", None)
    if own is None or isinstance(own, str):
        return own or ""
    return str(getattr(own, "model_id", "") or type(own).__name__)
