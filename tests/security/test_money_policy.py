"""Money thresholds: one operator token cannot move unbounded money (issue 12, reproduction 7).

Before: ``pay_invoice`` of 9,999,999,999.99 started through the API by an
operator completed with no approval. Now ``pay_invoice`` declares
``approval_above={"amount": 1000}`` on its ``pay`` dispatch: above it the task
waits for an approver (the same approval requests, digests and inbox as a
refund), and the payments system sees nothing until one approves. Every
payment is counted at the sandbox, the authoritative system, over real HTTP.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from demo.sandbox.models import Effect
from ledger.models import Action
from runtime import runner
from tasks import registry
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tests.conftest import api_client_for, make_user

pytestmark = pytest.mark.django_db(transaction=True)

HUGE = "9999999999.99"


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"


def post(user, path: str, body: Any):
    return api_client_for(user).post(path, json.dumps(body), content_type="application/json")


def start_payment(user, amount: str, invoice: str = "INV-9") -> Task:
    """``pay_invoice`` started through the API, as an integration would, then one worker pass."""
    body = {
        "task_type": "pay_invoice",
        "objective": f"Pay {invoice}",
        "input": {"invoice_id": invoice, "amount": amount, "currency": "EUR"},
    }
    response = post(user, "/api/tasks/", body)
    assert response.status_code == 201, response.content
    return run(Task.objects.get(pk=response.json()["id"]))


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def decide(user, request: ApprovalRequest, decision: str):
    body = {"decision": decision, "digest": request.digest}
    return post(user, f"/api/approvals/{request.pk}/decide/", body)


def payments() -> list[Effect]:
    return list(Effect.objects.filter(system="payments"))


def test_a_huge_payment_started_by_an_operator_waits_for_an_approval_and_pays_nothing(operator, acme):
    task = start_payment(operator, HUGE)
    assert (task.state, task.state_reason) == (State.WAITING_APPROVAL, "approval_requested")
    request = ApprovalRequest.objects.get(task=task)
    assert (request.status, request.action_step, request.approver_role) == ("pending", "pay", "approver")
    assert request.consequential["effect"]["amount"] == HUGE  # the digest binds the amount
    assert not Action.objects.filter(task=task).exists()  # not even an intent
    assert payments() == []
    run(task)  # another worker pass changes nothing while it waits
    assert payments() == []


def test_the_huge_payment_is_made_once_only_after_an_approver_approves(operator, approver, acme):
    task = start_payment(operator, HUGE)
    request = ApprovalRequest.objects.get(task=task)
    response = decide(approver, request, "approve")
    assert response.status_code == 200, response.content
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED
    [paid] = payments()
    assert Decimal(paid.request["amount"]) == Decimal(HUGE)
    assert task.outcome["payment_ref"] == str(paid.pk)


def test_a_rejected_huge_payment_ends_the_task_without_any_effect_at_the_sandbox(operator, approver, acme):
    task = start_payment(operator, HUGE)
    request = ApprovalRequest.objects.get(task=task)
    assert decide(approver, request, "reject").status_code == 200
    task = run(Task.objects.get(pk=task.pk))
    assert (task.state, task.state_reason) == (State.FAILED, "payment_rejected_by_approver")
    assert ApprovalRequest.objects.get(pk=request.pk).status == ApprovalStatus.REJECTED
    assert not Action.objects.filter(task=task).exists()
    assert payments() == []


def test_the_operator_cannot_approve_the_payment_they_started(operator, acme):
    task = start_payment(operator, HUGE)
    response = decide(operator, ApprovalRequest.objects.get(task=task), "approve")
    assert (response.status_code, response.json()["code"]) == (403, "not_an_approver")
    assert payments() == []


def test_an_operator_who_is_also_an_approver_cannot_approve_their_own_payment(acme):
    both = make_user("acme-both", acme, Role.OPERATOR, Role.APPROVER)
    task = start_payment(both, HUGE)
    response = decide(both, ApprovalRequest.objects.get(task=task), "approve")
    assert (response.status_code, response.json()["code"]) == (403, "self_approval")
    assert Task.objects.get(pk=task.pk).state == State.WAITING_APPROVAL
    assert payments() == []


def test_the_approval_card_says_the_threshold_the_amount_is_above(operator, approver, acme):
    task = start_payment(operator, "1000.01")
    request = ApprovalRequest.objects.get(task=task)
    why = "amount 1,000.01 is above the approval threshold of 1,000"
    assert why in request.policy_reason
    api = api_client_for(approver).get(f"/api/approvals/{request.pk}/").json()
    assert why in api["policy_reason"]
    console = Client()
    console.force_login(approver)
    page = console.get(f"/console/approvals/{request.pk}/")
    assert page.status_code == 200
    assert why in page.content.decode()


@pytest.mark.parametrize("amount", ["1000.00", "999.99", "0.01"])
def test_a_payment_at_or_below_the_threshold_is_paid_directly(operator, acme, amount):
    task = start_payment(operator, amount)
    assert task.state == State.COMPLETED
    assert not ApprovalRequest.objects.filter(task=task).exists()
    [paid] = payments()
    assert Decimal(paid.request["amount"]) == Decimal(amount)


# --- the declaration ---------------------------------------------------------------------------------

PAY = registry.get("pay_invoice").step_as("pay", registry.Dispatch)


@pytest.mark.parametrize(
    ("amount", "needs"),
    [("1000", False), ("1000.00", False), (1000, False), ("1000.01", True), (1e12, True), ("1E+4", True)],
)
def test_the_threshold_compares_the_amount_as_a_number(amount, needs):
    assert PAY.needs_approval({"amount": amount}) is needs


@pytest.mark.parametrize("amount", [None, "", "abc", "NaN", "Infinity", True, [1]])
def test_an_amount_that_cannot_be_read_as_a_number_needs_an_approval(amount):
    facts = {} if amount is None else {"amount": amount}
    assert PAY.needs_approval(facts) is True
    [why] = PAY.above_threshold(facts)
    assert why.startswith("amount ") and "threshold of 1,000" in why


def test_a_threshold_without_an_approval_step_to_ask_is_refused_when_declared():
    with pytest.raises(ValueError, match="approval_above needs the approval step"):
        registry.Dispatch("pay", connector="payments", approval_above={"amount": Decimal("1")})


def test_a_dispatch_that_names_an_approval_without_thresholds_always_needs_it():
    refund = registry.get("refund_request").step_as("pay_refund", registry.Dispatch)
    assert refund.needs_approval({"amount": "0.01"}) is True
    assert refund.above_threshold({"amount": "0.01"}) == []
