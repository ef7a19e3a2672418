"""An agent's money policy counts the run's own earlier calls: one task may make many effects.

A workflow's task makes one money effect, so the policy's "this one" was the task; an agent's run
makes one per call. A model that asks for two refunds of one order, each under the per-refund limit,
must meet the duplicate-reference approval on the second as two tasks would.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import Agent, Model, ModelResponse, Usage, function_tool
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from pydantic import BaseModel

from approvals.models import ApprovalRequest
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from tasks import registry
from tasks.registry import AgentEffect, AgentRun, Complete, TaskType
from tasks.states import State
from tests.conftest import make_task
from tests.sdk.test_support_agent import run_until_still
from workflows.support_agent import REFUNDS

pytestmark = pytest.mark.django_db(transaction=True)


@function_tool
def refund(order_id: str, amount: str, currency: str) -> str:
    """Refund an order."""
    raise NotImplementedError


class TwiceOver(Model):
    """Asks for two refunds of order A-1 in one turn (90 USD each, under the limit), then stops."""

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        answered = [i for i in input if isinstance(i, dict) and i.get("type") == "function_call_output"]
        out: list[Any]
        if not answered:
            out = [
                ResponseFunctionToolCall(
                    type="function_call",
                    call_id=call_id,
                    name="refund",
                    arguments=json.dumps({"order_id": "A-1", "amount": "90.00", "currency": "USD"}),
                )
                for call_id in ("r_1", "r_2")
            ]
        else:
            text = f"asked {len(answered)}"
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
    pass


TWICE = TaskType(
    name="twice_refund_agent",
    description="Two refunds of one order in one turn.",
    input_model=Empty,
    steps=(
        AgentRun(
            "agent",
            next="done",
            agent=Agent(name="twice", instructions="Refund twice.", tools=[refund], model=TwiceOver()),
            output="answer",
            tools=(
                AgentEffect(
                    "refund",
                    connector="payments",
                    money=REFUNDS,
                    effect=lambda args, facts: {"kind": "refund", **args},
                ),
            ),
        ),
        Complete("done", outcome=("answer",)),
    ),
)


@pytest.fixture(autouse=True)
def twice(monkeypatch, live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10
    settings.LEDGER_LOOKUP_INTERVAL = 0
    monkeypatch.setitem(registry._REGISTRY, TWICE.name, TWICE)


def test_a_second_refund_of_one_order_in_one_run_waits_for_an_approver(acme):
    task = run_until_still(make_task(acme, task_type=TWICE.name, objective="twice", input={}))

    assert task.state == State.WAITING_APPROVAL, task.state_reason
    actions = list(Action.objects.filter(task=task).order_by("id").values_list("step", "dispatch_state"))
    assert actions == [("refund#r_1", DispatchState.SUCCEEDED)]  # the second is not intended
    assert Effect.objects.filter(system="payments").count() == 1
    request = ApprovalRequest.objects.get(task=task)
    assert request.step == "refund#r_2:approve"
    assert "order A-1 was already refunded" in request.policy_reason
