"""The task types a caller can start, as a public contract: what ``/api/task-types/``, the console's
task-types page and the A2A agent card all show (one read, one shape).

A contract is derived from the registry (``tasks.registry``) and the policy version in force
(``tasks.models.Policy``); nothing here is stored. ``version`` changes whenever the type's input
schema, its steps or its policy version change, so a caller can cache a contract by it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from tasks import registry
from tasks.models import Policy


@dataclass(frozen=True)
class StepContract:
    name: str
    kind: str  # the step's class name: ReadEvidence, ModelTurn, RequestInput, Dispatch, AgentRun, …


@dataclass(frozen=True)
class ApprovalContract:
    """An effect that needs an approver: always, or only when its money policy finds something."""

    step: str  # the Dispatch step (an agent's tool: the tool's name)
    approval_step: str
    approver_role: str
    always: bool  # False: only above ``limits`` (or on a running total, a repeated reference)
    limits: dict[str, dict[str, str]]  # currency -> {"each": "100", "total": "1000"}


@dataclass(frozen=True)
class TaskTypeContract:
    name: str
    description: str
    version: str
    policy_version: str
    input_schema: dict[str, Any]  # JSON Schema (draft 2020-12) of the input, from the input model
    sensitive_fields: tuple[str, ...]
    steps: tuple[StepContract, ...]
    approvals: tuple[ApprovalContract, ...]


def contracts() -> list[TaskTypeContract]:
    """Every registered type, by name. (Task types are the deployment's; any member of a tenant may
    start any of them, so a caller's tenant does not narrow the list today.)"""
    policies = dict(Policy.objects.values_list("task_type", "version"))
    return [_contract(registry.get(name), policies.get(name)) for name in sorted(registry.names())]


def contract(name: str) -> TaskTypeContract | None:
    if name not in registry.names():
        return None
    policy = Policy.objects.filter(task_type=name).values_list("version", flat=True).first()
    return _contract(registry.get(name), policy)


def _contract(kind: registry.TaskType, policy: str | None) -> TaskTypeContract:
    policy_version = policy or settings.DEFAULT_POLICY_VERSION
    schema = kind.input_model.model_json_schema()
    steps = tuple(StepContract(step.name, type(step).__name__) for step in kind.steps)
    shape = json.dumps([schema, [(s.name, s.kind) for s in steps], policy_version], sort_keys=True)
    return TaskTypeContract(
        name=kind.name,
        description=kind.description,
        version=hashlib.sha256(shape.encode()).hexdigest()[:16],
        policy_version=policy_version,
        input_schema=schema,
        sensitive_fields=tuple(sorted(kind.sensitive)),
        steps=steps,
        approvals=(),  # TODO(helper task-types): every RequestApproval, with its money policy's limits
    )
