"""Parallel tool calls of one model turn start in a fixed order: the model's, one step each."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Usage, function_tool
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import BaseModel

from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime.models import AgentTurn
from tasks import registry
from tasks.registry import AgentEffect, AgentRun, Complete, TaskType
from tasks.states import State
from tests.conftest import make_task
from tests.sdk.test_support_agent import run_until_still

pytestmark = pytest.mark.django_db(transaction=True)


@function_tool
def notify(order_id: str, template: str) -> str:
    """E-mail the customer."""
    raise NotImplementedError


class Burst(Model):
    """Asks for three e-mails at once (the last listed first by id), then says it is done."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        answered = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if not answered:
            out: list[Any] = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=call_id,
                    name="notify",
                    arguments=json.dumps({"order_id": "A-1", "template": template}),
                )
                for call_id, template in (("c_z", "first"), ("c_a", "second"), ("c_m", "third"))
            ]
        else:
            text = f"sent {len(answered)}"
            out = [
                ResponseOutputMessage(
                    type="message",
                    id="m",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class Empty(BaseModel):
    customer_email: str = "c@example.com"


BURST = TaskType(
    name="burst_agent",
    description="Three e-mails in one turn.",
    input_model=Empty,
    sensitive=frozenset({"customer_email"}),
    steps=(
        AgentRun(
            "agent",
            next="done",
            agent=Agent(name="burst", instructions="Send three.", tools=[notify], model=Burst()),
            output="answer",
            tools=(
                AgentEffect(
                    "notify",
                    connector="email",
                    sensitive=frozenset({"to"}),
                    effect=lambda args, facts: {
                        "kind": "email",
                        "to": facts.get("customer_email"),
                        "template": args.get("template"),
                        "order_id": args.get("order_id"),
                    },
                ),
            ),
        ),
        Complete("done", outcome=("answer",)),
    ),
)


@pytest.fixture(autouse=True)
def burst(monkeypatch, live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10
    monkeypatch.setitem(registry._REGISTRY, BURST.name, BURST)


def test_three_calls_of_one_turn_are_performed_one_step_each_in_the_models_order(acme):
    task = run_until_still(make_task(acme, task_type="burst_agent", objective="burst", input={}))

    assert task.state == State.COMPLETED and task.outcome["answer"] == "sent 3"
    actions = list(Action.objects.filter(task=task).order_by("id").values_list("step", "dispatch_state"))
    assert actions == [
        ("notify#c_z", DispatchState.SUCCEEDED),
        ("notify#c_a", DispatchState.SUCCEEDED),
        ("notify#c_m", DispatchState.SUCCEEDED),
    ]
    sent = [effect.request["template"] for effect in Effect.objects.order_by("id")]
    assert sent == ["first", "second", "third"]
    assert AgentTurn.objects.filter(task=task).count() == 2  # the model was asked twice, never again
