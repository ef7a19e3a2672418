"""The support agent (an OpenAI Agents SDK agent) run durably: turns recorded, calls through the ledger.

Driven through the in-process resume loop against the sandbox over real HTTP, with the agent's
deterministic SDK model. Each claim of the loop runs the SDK from our records and commits one thing.
"""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime.models import AgentSessionItem, AgentSnapshot, AgentTurn, ModelUsage
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10  # generous: a loaded CI machine must not turn a read into a retry
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1", total="500.00")


def support_task(tenant, amount: str = "30.00", order_id: str = "A-1") -> Task:
    return make_task(
        tenant,
        task_type="support_agent",
        objective="Customer asks for a refund of A-1",
        input={"order_id": order_id, "customer_email": "c@example.com", "amount": amount, "currency": "USD"},
    )


def run_until_still(task: Task, limit: int = 40) -> Task:
    for _ in range(limit):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError("the agent did not settle")


def test_a_small_refund_runs_to_completion_with_every_call_through_the_ledger(acme):
    task = run_until_still(support_task(acme))

    assert task.state == State.COMPLETED, task.state_reason
    assert "Refunded 30.00 USD for order A-1" in task.outcome["answer"]
    steps = list(Action.objects.filter(task=task).order_by("id").values_list("step", "dispatch_state"))
    assert steps == [
        ("refund_order#call_2_refund_order", DispatchState.SUCCEEDED),
        ("email_customer#call_3_email_customer", DispatchState.SUCCEEDED),
    ]
    assert [e.system for e in Effect.objects.order_by("id")] == ["payments", "email"]
    assert AgentTurn.objects.filter(task=task).count() == 4  # lookup, refund, e-mail, final answer
    codes = list(
        TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("reason_code", flat=True)
    )
    # Each turn commits with what it led to: the look-up read, the two calls' intents, the answer.
    assert codes == [
        "",  # created
        "agent_evidence",
        "agent_tool_call",
        "",  # the refund's outcome recorded
        "agent_tool_call",
        "",  # the e-mail's outcome recorded
        "agent_finished",
        "",  # completed
    ]
    assert ModelUsage.objects.filter(task=task).count() == 4


def test_a_refund_above_the_limit_pauses_with_its_run_state_stored_and_runs_once_approved(acme, approver):
    task = run_until_still(support_task(acme, amount="150.00"))

    assert task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    assert request.step == "refund_order#call_2_refund_order:approve"
    assert request.consequential["binds"] == {
        "agent": "support",
        "tool": "refund_order",
        "call": "call_2_refund_order",
    }
    snapshot = AgentSnapshot.objects.get(task=task)
    assert snapshot.turns == 2 and snapshot.schema_version
    assert not Effect.objects.exists()

    approve(task, approver)
    task = run_until_still(Task.objects.get(pk=task.pk))

    assert task.state == State.COMPLETED, task.state_reason
    refunds = Effect.objects.filter(system="payments")
    assert refunds.count() == 1 and refunds.get().request["amount"] == "150.00"


def test_a_rejected_refund_is_told_to_the_agent_which_ends_without_paying(acme, approver):
    task = run_until_still(support_task(acme, amount="150.00"))
    approve(task, approver, decision="reject")
    task = run_until_still(Task.objects.get(pk=task.pk))

    assert task.state == State.COMPLETED, task.state_reason
    assert "not paid: an approver rejected it" in task.outcome["answer"]
    assert not Effect.objects.exists()
    assert not Action.objects.filter(task=task).exists()


def test_a_customers_second_request_starts_from_the_first_ones_conversation(acme):
    first = run_until_still(support_task(acme))
    assert first.state == State.COMPLETED and "asked before" not in first.outcome["answer"]
    remembered = AgentSessionItem.objects.filter(tenant=acme, task=first).count()
    assert remembered >= 8  # the brief, four turns' items and three calls' outputs

    put_order("A-2", total="80.00")  # another order: a second refund of A-1 would need an approver
    second = run_until_still(support_task(acme, amount="20.00", order_id="A-2"))

    assert second.state == State.COMPLETED, (second.state_reason, second.outcome)
    assert "They have asked before." in second.outcome["answer"]
    assert AgentSessionItem.objects.filter(tenant=acme, task=second).count() == remembered
    # Memory is per customer, and nothing of it is in clear.
    assert AgentSessionItem.objects.values("session_id").distinct().count() == 1
    assert not AgentSessionItem.objects.filter(item__icontains="c@example.com").exists()
