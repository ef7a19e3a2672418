"""An agent run's handoffs and guardrail trips are transitions of the task's history."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import (
    Agent,
    GuardrailFunctionOutput,
    InputGuardrail,
    Model,
    ModelResponse,
    Usage,
)
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import BaseModel

from audit.models import TransitionEvent
from runtime.models import AgentTurn
from tasks import registry
from tasks.models import Task
from tasks.registry import AgentRun, Complete, TaskType
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run

pytestmark = pytest.mark.django_db(transaction=True)


class Ask(BaseModel):
    question: str


class Desk(Model):
    """Triage hands every question to the specialist, which answers it."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        if "triage" in str(system_instructions):
            out: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call", call_id="call_h1", name="transfer_to_specialist", arguments="{}"
                )
            ]
        else:
            out = [
                ResponseOutputMessage(
                    type="message",
                    id="m1",
                    role="assistant",
                    status="completed",
                    content=[
                        ResponseOutputText(
                            type="output_text", text="The specialist answered.", annotations=[]
                        )
                    ],
                )
            ]
        return ModelResponse(
            output=out,
            usage=Usage(requests=1, input_tokens=3, output_tokens=2, total_tokens=5),
            response_id=None,
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def no_secrets(ctx: Any, agent: Any, given: Any) -> GuardrailFunctionOutput:
    text = json.dumps(given, default=str)
    return GuardrailFunctionOutput(output_info=None, tripwire_triggered="password" in text)


SPECIALIST = Agent(name="specialist", instructions="You answer questions.", model=Desk())
TRIAGE = Agent(
    name="triage",
    instructions="You are triage: hand off.",
    model=Desk(),
    handoffs=[SPECIALIST],
    input_guardrails=[
        InputGuardrail(guardrail_function=no_secrets, name="no_secrets", run_in_parallel=False)
    ],
)
DESK = TaskType(
    name="help_desk",
    description="Triage hands a question to a specialist.",
    input_model=Ask,
    steps=(
        AgentRun("agent", next="done", agent=TRIAGE, brief=("question",), output="answer"),
        Complete("done", outcome=("answer",)),
    ),
)


@pytest.fixture(autouse=True)
def desk(monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, DESK.name, DESK)


def settle(task: Task) -> Task:
    for _ in range(20):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError("did not settle")


def test_a_handoff_is_a_transition_naming_both_agents(acme):
    task = settle(
        make_task(acme, task_type="help_desk", objective="q", input={"question": "Where is my parcel?"})
    )

    assert task.state == State.COMPLETED and task.outcome["answer"] == "The specialist answered."
    assert list(AgentTurn.objects.filter(task=task).order_by("turn").values_list("agent", flat=True)) == [
        "triage",
        "specialist",
    ]
    handoff = TransitionEvent.objects.get(task=task, reason_code="agent_handoff")
    assert "triage handed off to specialist" in handoff.reason


def test_a_tripped_input_guardrail_fails_the_task_with_its_name(acme):
    task = settle(
        make_task(acme, task_type="help_desk", objective="q", input={"question": "my password is hunter2"})
    )

    assert (task.state, task.state_reason) == (State.FAILED, "agent_guardrail_tripped")
    event = TransitionEvent.objects.get(task=task, reason_code="agent_guardrail_tripped")
    assert "no_secrets" in event.reason
    assert not AgentTurn.objects.filter(task=task).exists()
