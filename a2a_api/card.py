"""The agent card: what an A2A client reads first to know what we run and how to call it.

Built per request from ``reads.task_types.contracts()`` (one skill per task type) and
``PUBLIC_BASE_URL``. A2A v1.0's ``AgentSkill`` has no field for an input schema, so each type's JSON
Schema travels in the card's one extension, ``TASK_TYPES_EXTENSION``: its ``params`` map each skill id
to ``{"version": …, "inputSchema": {…}, "sensitiveFields": […]}``, the same contract
``GET /api/task-types/{name}/`` answers.
"""

from __future__ import annotations

import json

from a2a.types import a2a_pb2
from django.conf import settings

from reads.task_types import TaskTypeContract, contracts

PROTOCOL_VERSION = "1.0"
TASK_TYPES_EXTENSION = "urn:durable-agents:a2a:task-types:v1"
BEARER = "bearer"  # the security scheme's name in the card


def endpoint_url() -> str:
    return f"{settings.PUBLIC_BASE_URL}/a2a/"


def _skill(contract: TaskTypeContract) -> a2a_pb2.AgentSkill:
    example = json.dumps({"task_type": contract.name, "input": {}})
    return a2a_pb2.AgentSkill(
        id=contract.name,
        name=contract.name,
        description=(
            f"{contract.description} Start it with a data part {example} "
            f"(input schema: the card extension {TASK_TYPES_EXTENSION}, or /api/task-types/{contract.name}/)."
        ),
        tags=["task-type", f"version:{contract.version}"],
        input_modes=["application/json"],
        output_modes=["application/json"],
    )


def agent_card(types: list[TaskTypeContract] | None = None) -> a2a_pb2.AgentCard:
    """The card; ``types`` narrows the skills (the extended card: the caller's tenant's types)."""
    shown = contracts() if types is None else types
    extension = a2a_pb2.AgentExtension(
        uri=TASK_TYPES_EXTENSION,
        description="Each skill's input JSON Schema (draft 2020-12), contract version and sensitive fields",
        required=False,
    )
    extension.params.update(
        {
            c.name: {
                "version": c.version,
                "inputSchema": c.input_schema,
                "sensitiveFields": list(c.sensitive_fields),
            }
            for c in shown
        }
    )
    card = a2a_pb2.AgentCard(
        name=settings.A2A_AGENT_NAME,
        description=(
            "Durable agent execution: tasks that pause for days, survive worker deaths and never repeat "
            "an unsafe side effect. Approvals are decided by our approvers, never by a calling agent."
        ),
        version=settings.DEPLOYMENT_ID,
        supported_interfaces=[
            a2a_pb2.AgentInterface(
                url=endpoint_url(), protocol_binding="JSONRPC", protocol_version=PROTOCOL_VERSION
            )
        ],
        # streaming: SendStreamingMessage and SubscribeToTask are served (a2a_api.stream).
        capabilities=a2a_pb2.AgentCapabilities(
            streaming=True, push_notifications=True, extended_agent_card=True, extensions=[extension]
        ),
        default_input_modes=["application/json", "text/plain"],
        default_output_modes=["application/json"],
        skills=[_skill(c) for c in shown],
    )
    card.security_schemes[BEARER].http_auth_security_scheme.CopyFrom(
        a2a_pb2.HTTPAuthSecurityScheme(
            scheme="Bearer",
            description="An API token of ours with the integrate scope: Authorization: Bearer <key>",
        )
    )
    requirement = card.security_requirements.add()
    requirement.schemes[BEARER].SetInParent()
    return card
