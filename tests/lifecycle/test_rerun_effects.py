"""A rerun does not pay again unasked (issue 20, item 4).

Before: a ``pay_invoice`` task whose payment succeeded while its outcome was in
doubt was canceled by an operator (the cancel reconciled the payment: done, not
undone), and an operator's rerun of it — a new task id, so new ledger keys —
paid the invoice a second time. Now a rerun reaching a dispatch whose effect its
original (or any task up its ``rerun_of`` chain) completed, with the same step
and the same effect, records that effect as done with the original's outcome and
sends nothing; its event says so (``effect_reused``). A rerun whose effect
differs (the order's total changed since) but pays the same business reference
goes through a new approval that shows the earlier payment. Counted at the
sandbox over live HTTP.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from pydantic import BaseModel, ConfigDict

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from ledger.policy import MoneyPolicy
from tasks import registry
from tasks.models import Task
from tasks.registry import Complete, Dispatch, Fail, ReadEvidence, RequestApproval, TaskType
from tasks.states import State
from tests.conftest import api_client_for, make_task
from tests.runtime.payments import cancel, fault, run
from tests.workflow import approve, put_order
from workflows import pay_invoice

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0


def invoice_payments(invoice: str) -> list[Effect]:
    return [e for e in Effect.objects.filter(system="payments") if e.request.get("invoice") == invoice]


def start(operator, invoice: str = "INV-7", amount: str = "400.00") -> Task:
    body = {
        "task_type": "pay_invoice",
        "objective": f"Pay {invoice}",
        "input": {"invoice_id": invoice, "amount": amount, "currency": "EUR"},
    }
    response = api_client_for(operator).post("/api/tasks/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    return run(Task.objects.get(pk=response.json()["id"]))


def paid_then_canceled(operator) -> Task:
    """The payment lands while its answer times out; the operator cancels; the cancel finds it paid."""
    fault("timeout", seconds=1)
    task = start(operator)
    assert task.state == State.OUTCOME_UNKNOWN
    task = run(cancel(task, operator))
    assert task.state == State.CANCELED
    assert Action.objects.get(task=task).dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    assert len(invoice_payments("INV-7")) == 1
    return task


def start_rerun(operator, task: Task) -> Task:
    """The operator's rerun of ``task`` through the API (not run yet)."""
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/rerun/", json.dumps({"reason": "try again"}), content_type="application/json"
    )
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


def rerun(operator, task: Task) -> Task:
    return run(start_rerun(operator, task))


def test_a_rerun_of_a_task_whose_payment_succeeded_does_not_pay_again(operator, acme):
    old = paid_then_canceled(operator)
    new = rerun(operator, old)
    assert new.state == State.COMPLETED
    [paid] = invoice_payments("INV-7")  # exactly one payment for the invoice
    assert new.outcome["payment_ref"] == str(paid.pk) == Action.objects.get(task=old).external_ref
    assert not Action.objects.filter(task=new).exists()  # no intent, nothing sent


def test_the_rerun_says_it_reused_the_originals_outcome(operator, acme):
    old = paid_then_canceled(operator)
    new = rerun(operator, old)
    original = Action.objects.get(task=old)
    event = TransitionEvent.objects.get(task=new, reason_code="effect_reused")
    assert original.idempotency_key in event.reason
    assert str(old.id) in event.reason and "nothing sent" in event.reason
    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{new.id}/")
    assert page.status_code == 200 and "effect_reused" in page.content.decode()  # the history shows it
    api = api_client_for(operator).get(f"/api/tasks/{new.id}/events/").json()
    assert "effect_reused" in json.dumps(api)


def test_a_rerun_of_a_rerun_reuses_the_payment_made_two_tasks_back(operator, acme):
    old = paid_then_canceled(operator)
    middle = run(cancel(start_rerun(operator, old), operator))  # canceled before it ran
    assert middle.state == State.CANCELED
    again = rerun(operator, middle)
    assert again.state == State.COMPLETED
    assert len(invoice_payments("INV-7")) == 1
    assert again.outcome["payment_ref"] == Action.objects.get(task=old).external_ref


def test_a_rerun_of_a_task_whose_payment_failed_pays(operator, acme):
    fault("reject")
    old = start(operator)
    assert old.state == State.FAILED
    new = rerun(operator, old)
    assert new.state == State.COMPLETED
    assert [e.status for e in invoice_payments("INV-7")] == ["succeeded"]


class _Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: str
    currency: str = "EUR"


# A throwaway type paying an order's total as the orders system says it now: a rerun after the
# total changed builds a different effect for the same order.
PAY_TOTAL = TaskType(
    name="pay_order_total",
    description="pay the order's current total",
    input_model=_Order,
    steps=(
        ReadEvidence("read", next="pay", system="orders", record_from="order_id", facts={"total": "total"}),
        Dispatch(
            "pay",
            next="done",
            connector="payments",
            output="payment_ref",
            approval="approve",
            money=MoneyPolicy(
                limits=pay_invoice.LIMITS, amount="total", reference="order_id", reference_kind="order"
            ),
            effect=lambda f: {
                "kind": "charge",
                "order": f["order_id"],
                "amount": f["total"],
                "currency": "EUR",
            },
        ),
        Complete("done", outcome=("payment_ref",)),
        RequestApproval("approve", next="pay", action_step="pay", on_rejected="no"),
        Fail("no", reason="payment_rejected_by_approver"),
    ),
)


@pytest.fixture
def pay_total():
    registry.register(PAY_TOTAL)
    yield
    registry._REGISTRY.pop(PAY_TOTAL.name)  # a test's throwaway type


def test_a_rerun_whose_effect_differs_pays_the_same_order_only_through_an_approval_showing_the_first(
    operator, approver, acme, pay_total
):
    put_order("A-7", total="40.00")
    fault("timeout", seconds=1)
    old = run(make_task(acme, task_type="pay_order_total", objective="Pay A-7", input={"order_id": "A-7"}))
    assert old.state == State.OUTCOME_UNKNOWN
    old = run(cancel(old, operator))
    assert old.state == State.CANCELED  # the 40.00 was paid, and stays paid
    put_order("A-7", total="45.00")  # the total changed since

    new = rerun(operator, old)
    assert (new.state, new.state_reason) == (State.WAITING_APPROVAL, "approval_requested")
    assert len(Effect.objects.filter(system="payments")) == 1  # not paid again unasked
    request = ApprovalRequest.objects.get(task=new)
    assert request.consequential["effect"]["amount"] == "45.00"
    assert "order A-7 was already paid: 40.00 EUR on" in request.policy_reason
    assert str(old.id) in request.policy_reason

    approve(new, approver)  # asked, explicitly: paid once more
    assert run(Task.objects.get(pk=new.pk)).state == State.COMPLETED
    assert Effect.objects.filter(system="payments").count() == 2
