"""Money policy: one operator token cannot move unbounded money (issue 12, reproduction 7; issue 20, item 4).

Before: ``pay_invoice`` of 9,999,999,999.99 started through the API by an
operator completed with no approval; then the threshold was one number in
whatever currency code was sent (1,000 XAU and 1,000 KWD paid without approval),
the same invoice was paid twice under two idempotency keys, and payments just
under the threshold added up without limit. Now ``pay_invoice`` declares a
``MoneyPolicy`` on its ``pay`` dispatch (``ledger.money``): a limit per currency
(an unknown currency always needs approval), a running total per requester and
per API token over a day, and the invoice as its business reference. Whatever
it finds sends the payment to an approver (the same approval requests, digests
and inbox as a refund) with the reason shown, and the payments system sees
nothing until one approves. Every payment is counted at the sandbox, the
authoritative system, over real HTTP.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils.html import escape
from pydantic import BaseModel, ConfigDict

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action
from ledger.policy import MoneyPolicy
from runtime import runner
from tasks import registry
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tests.conftest import api_client_for, make_user
from workflows import pay_invoice

pytestmark = pytest.mark.django_db(transaction=True)

HUGE = "9999999999.99"


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"


def post(user, path: str, body: Any):
    return api_client_for(user).post(path, json.dumps(body), content_type="application/json")


def start_payment(
    user, amount: str, invoice: str = "INV-9", currency: str = "EUR", *, client=None, key: str | None = None
) -> Task:
    """``pay_invoice`` started through the API, as an integration would, then one worker pass."""
    body: dict[str, Any] = {
        "task_type": "pay_invoice",
        "objective": f"Pay {invoice}",
        "input": {"invoice_id": invoice, "amount": amount, "currency": currency},
    }
    if key is not None:
        body["idempotency_key"] = key
    api = client or api_client_for(user)
    response = api.post("/api/tasks/", json.dumps(body), content_type="application/json")
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


def test_the_approval_card_says_the_limit_the_amount_is_above(operator, approver, acme):
    task = start_payment(operator, "1000.01")
    request = ApprovalRequest.objects.get(task=task)
    why = "1,000.01 EUR is above EUR's limit of 1,000"
    assert why in request.policy_reason
    # Every declared check is shown, also those that found nothing.
    total = "running total for acme-operator over the last 24 hours: 1,000.01 EUR of 5,000 EUR with this one"
    assert total in request.policy_reason
    api = api_client_for(approver).get(f"/api/approvals/{request.pk}/").json()
    assert why in api["policy_reason"]
    console = Client()
    console.force_login(approver)
    page = console.get(f"/console/approvals/{request.pk}/")
    assert page.status_code == 200
    assert escape(why) in page.content.decode()


@pytest.mark.parametrize("amount", ["1000.00", "999.99", "0.01"])
def test_a_payment_at_or_below_the_threshold_is_paid_directly(operator, acme, amount):
    task = start_payment(operator, amount)
    assert task.state == State.COMPLETED
    assert not ApprovalRequest.objects.filter(task=task).exists()
    [paid] = payments()
    assert Decimal(paid.request["amount"]) == Decimal(amount)


# --- limits per currency ------------------------------------------------------------------------------


def test_1000_kwd_needs_an_approval_because_kwd_has_its_own_lower_limit(operator, acme):
    task = start_payment(operator, "1000.00", currency="KWD")
    assert (task.state, task.state_reason) == (State.WAITING_APPROVAL, "approval_requested")
    request = ApprovalRequest.objects.get(task=task)
    assert "1,000.00 KWD is above KWD's limit of 250" in request.policy_reason
    assert payments() == []


@pytest.mark.parametrize("currency", ["XAU", "ZZZ"])
def test_a_currency_without_a_limit_in_the_table_needs_an_approval_whatever_the_amount(
    operator, acme, currency
):
    task = start_payment(operator, "1.00", currency=currency)
    assert task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    assert f"{currency} has no limit in this task type's table, so it needs approval" in request.policy_reason
    assert payments() == []


@pytest.mark.parametrize(("amount", "currency"), [("250.000", "KWD"), ("150000", "JPY"), ("1000", "USD")])
def test_an_amount_at_its_currencys_limit_is_paid_directly(operator, acme, amount, currency):
    task = start_payment(operator, amount, currency=currency)
    assert task.state == State.COMPLETED
    assert not ApprovalRequest.objects.exists()
    assert len(payments()) == 1


# --- the same invoice twice ---------------------------------------------------------------------------


def test_the_same_invoice_under_a_second_idempotency_key_waits_for_an_approval_showing_the_first(
    operator, approver, acme
):
    first = start_payment(operator, "500.00", invoice="INV-7", key="pay-inv-7-a")
    assert first.state == State.COMPLETED
    [paid] = payments()
    second = start_payment(operator, "500.00", invoice="INV-7", key="pay-inv-7-b")
    assert (second.state, second.state_reason) == (State.WAITING_APPROVAL, "approval_requested")
    assert len(payments()) == 1  # not paid again
    request = ApprovalRequest.objects.get(task=second)
    earlier = Action.objects.get(task=first)
    shown = (
        f"invoice INV-7 was already paid: 500.00 EUR on {earlier.created_at:%Y-%m-%d %H:%M} UTC by task"
        f" {first.id} (succeeded, external ref {paid.pk})"
    )
    assert shown in request.policy_reason
    console = Client()
    console.force_login(approver)
    page = console.get(f"/console/approvals/{request.pk}/").content.decode()
    assert escape(shown) in page
    assert f'href="/console/tasks/{first.id}/"' in page  # a link to the task that paid it


def test_the_same_invoice_paid_again_after_an_approval_is_paid_once_more(operator, approver, acme):
    start_payment(operator, "500.00", invoice="INV-7")
    second = start_payment(operator, "500.00", invoice="INV-7")
    assert decide(approver, ApprovalRequest.objects.get(task=second), "approve").status_code == 200
    assert run(Task.objects.get(pk=second.pk)).state == State.COMPLETED
    assert len(payments()) == 2


def test_an_approval_asked_before_another_task_paid_the_invoice_does_not_cover_paying_it_again(
    operator, approver, acme
):
    """The approver consented to 2,000 EUR for INV-7 when nobody had paid it; meanwhile another task
    paid INV-7. The approval does not cover a second payment: the task asks again, showing it."""
    big = start_payment(operator, "2000.00", invoice="INV-7")
    assert big.state == State.WAITING_APPROVAL
    other = make_user("acme-operator2", acme, Role.OPERATOR)
    small = start_payment(other, "500.00", invoice="INV-7")  # no effect of big's yet: paid directly
    assert small.state == State.COMPLETED
    assert decide(approver, ApprovalRequest.objects.get(task=big), "approve").status_code == 200

    big = run(Task.objects.get(pk=big.pk))
    assert (big.state, big.state_reason) == (State.WAITING_APPROVAL, "approval_requested")
    assert len(payments()) == 1
    again = ApprovalRequest.objects.filter(task=big, status="pending").get()
    assert "invoice INV-7 was already paid: 500.00 EUR on" in again.policy_reason
    assert str(small.id) in again.policy_reason
    event = TransitionEvent.objects.filter(task=big, reason_code="approval_requested").latest("state_version")
    assert event.reason.startswith("re-approval: made since it was asked: 500.00 EUR")

    # The re-approval is a later request for the same action: whoever decided the first may not
    # decide it (separation of duties, ``approvals.authority``); another approver does.
    refused = decide(approver, again, "approve")
    assert (refused.status_code, refused.json()["code"]) == (403, "decided_before")
    assert decide(make_user("acme-approver2", acme, Role.APPROVER), again, "approve").status_code == 200
    assert run(Task.objects.get(pk=big.pk)).state == State.COMPLETED
    assert len(payments()) == 2


def test_the_approver_of_an_invoices_first_payment_may_approve_another_tasks_second(operator, approver, acme):
    """A second payment of the invoice by another task is another action, not a later request for the
    same one: its approval shows the first payment, and the first one's approver and requester
    caused nothing of it, so they are not barred (only the lineage's people are)."""
    first = start_payment(operator, "2000.00", invoice="INV-7")
    assert decide(approver, ApprovalRequest.objects.get(task=first), "approve").status_code == 200
    assert run(Task.objects.get(pk=first.pk)).state == State.COMPLETED
    both = make_user("acme-both", acme, Role.OPERATOR, Role.APPROVER)
    second = start_payment(both, "500.00", invoice="INV-7")
    request = ApprovalRequest.objects.get(task=second)
    assert set(request.barred) == {"user:acme-both"}
    assert decide(approver, request, "approve").status_code == 200
    assert run(Task.objects.get(pk=second.pk)).state == State.COMPLETED
    assert len(payments()) == 2


def test_an_invoice_whose_first_payment_was_refused_is_paid_without_an_approval(operator, acme):
    from tests.runtime.payments import fault

    fault("reject")
    first = start_payment(operator, "500.00", invoice="INV-7")
    assert first.state == State.FAILED
    second = start_payment(operator, "500.00", invoice="INV-7")
    assert second.state == State.COMPLETED
    assert len([p for p in payments() if p.status == "succeeded"]) == 1


class _Fee(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice_id: str
    amount: Decimal
    currency: str = "EUR"


# A throwaway type declaring that the same invoice is never paid twice: refused, not asked about.
PAY_ONCE = registry.TaskType(
    name="pay_once",
    description="pay an invoice at most once",
    input_model=_Fee,
    steps=(
        registry.Dispatch(
            "pay",
            next="done",
            connector="payments",
            output="payment_ref",
            approval="approve",
            money=MoneyPolicy(
                limits=pay_invoice.LIMITS,
                reference="invoice_id",
                reference_kind="invoice",
                on_duplicate="refuse",
            ),
            effect=lambda f: {"kind": "charge", "invoice": f["invoice_id"], "amount": f["amount"]},
        ),
        registry.Complete("done", outcome=("payment_ref",)),
        registry.RequestApproval("approve", next="pay", action_step="pay", on_rejected="no"),
        registry.Fail("no", reason="payment_rejected_by_approver"),
    ),
)


@pytest.fixture
def pay_once():
    registry.register(PAY_ONCE)
    yield
    registry._REGISTRY.pop(PAY_ONCE.name)  # a test's throwaway type


def test_a_type_declaring_refuse_fails_the_second_payment_of_an_invoice_and_sends_nothing(
    operator, acme, pay_once
):
    def start(key: str) -> Task:
        body = {"task_type": "pay_once", "objective": "Pay INV-7", "idempotency_key": key,
                "input": {"invoice_id": "INV-7", "amount": "10.00"}}  # fmt: skip
        response = post(operator, "/api/tasks/", body)
        assert response.status_code == 201, response.content
        return run(Task.objects.get(pk=response.json()["id"]))

    first = start("a")
    assert first.state == State.COMPLETED
    second = start("b")
    assert (second.state, second.state_reason) == (State.FAILED, "duplicate_reference")
    assert second.outcome == {"reason": "duplicate_reference", "step": "pay"}
    event = TransitionEvent.objects.get(task=second, reason_code="duplicate_reference")
    assert "invoice INV-7 was already paid: 10.00 EUR on" in event.reason and str(first.id) in event.reason
    assert len(payments()) == 1
    assert not Action.objects.filter(task=second).exists()


# --- running totals -----------------------------------------------------------------------------------


def test_payments_just_under_the_limit_add_up_to_an_approval_for_the_requester(operator, acme):
    for n in range(5):  # 5,000 EUR today: at the running limit
        assert start_payment(operator, "1000.00", invoice=f"INV-{n}").state == State.COMPLETED
    task = start_payment(operator, "1000.00", invoice="INV-5")
    assert task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    why = (
        "running total for acme-operator over the last 24 hours: 6,000.00 EUR with this one,"
        " above the limit of 5,000 EUR"
    )
    assert why in request.policy_reason
    assert "token" not in request.policy_reason  # started in a session: no token total
    assert len(payments()) == 5


def test_another_requesters_payments_do_not_count_towards_this_ones_total(operator, acme):
    other = make_user("acme-operator2", acme, Role.OPERATOR)
    for n in range(5):
        assert start_payment(other, "1000.00", invoice=f"INV-{n}").state == State.COMPLETED
    assert start_payment(operator, "1000.00", invoice="INV-5").state == State.COMPLETED


def test_payments_through_one_api_token_add_up_to_an_approval_naming_the_token(acme):
    from datetime import timedelta

    from django.utils import timezone

    from tenancy.services import token_create

    bot = make_user("acme-integrator", acme, Role.INTEGRATOR)
    token, key = token_create(
        bot, scopes=["integrate"], name="billing", expires_at=timezone.now() + timedelta(hours=1)
    )
    client = Client(HTTP_AUTHORIZATION=f"Token {key}")
    for n in range(5):
        assert start_payment(bot, "1000.00", invoice=f"INV-{n}", client=client).state == State.COMPLETED
    task = start_payment(bot, "1000.00", invoice="INV-5", client=client)
    assert task.api_token_id == token.pk  # the task records the token it was started with
    assert task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    assert (
        f"running total for token {token.prefix}… (billing) over the last 24 hours: 6,000.00 EUR"
        " with this one, above the limit of 5,000 EUR" in request.policy_reason
    )
    assert len(payments()) == 5


def test_payments_in_flight_count_towards_the_running_total(operator, acme, settings):
    from tests.runtime.payments import fault

    settings.CONNECTOR_TIMEOUT = 10  # generous: a loaded machine must not turn these into timeouts
    for n in range(4):
        assert start_payment(operator, "1000.00", invoice=f"INV-{n}").state == State.COMPLETED
    settings.CONNECTOR_TIMEOUT = 0.3
    fault("timeout", seconds=1)
    assert start_payment(operator, "1000.00", invoice="INV-4").state == State.OUTCOME_UNKNOWN
    assert start_payment(operator, "1000.00", invoice="INV-5").state == State.WAITING_APPROVAL


def test_an_intent_whose_review_missed_a_payment_committed_meanwhile_is_voided_in_its_commit(
    operator, approver, acme, monkeypatch
):
    """Two payments of INV-7 racing: the second reviewed before the first committed (nothing found),
    so it decides to intend. The review runs again under the locks inside the intent's own commit,
    sees the first payment, and the intent is not committed; the next pass asks an approver."""
    from approvals import services as approval_services
    from ledger.money import Review

    start_payment(operator, "500.00", invoice="INV-7")
    monkeypatch.setattr(approval_services, "money_review", lambda *args: Review())  # the stale review
    second = start_payment(operator, "500.00", invoice="INV-7")
    assert (second.state, second.state_version) == (State.READY, 1)  # its decision was discarded
    assert not Action.objects.filter(task=second).exists()
    monkeypatch.undo()
    assert run(second).state == State.WAITING_APPROVAL
    assert len(payments()) == 1


# --- the declaration ---------------------------------------------------------------------------------

PAY = registry.get("pay_invoice").step_as("pay", registry.Dispatch)
EUR = {"currency": "EUR"}


@pytest.mark.parametrize(
    ("amount", "over"),
    [("1000", False), ("1000.00", False), (1000, False), ("1000.01", True), (1e12, True), ("1E+4", True)],
)
def test_the_limit_compares_the_amount_as_a_number(amount, over):
    assert PAY.money is not None
    assert bool(PAY.money.over_limit({"amount": amount, **EUR})) is over


@pytest.mark.parametrize("amount", [None, "", "abc", "NaN", "Infinity", True, [1]])
def test_an_amount_that_cannot_be_read_as_a_number_needs_an_approval(amount):
    assert PAY.money is not None
    facts = EUR if amount is None else {"amount": amount, **EUR}
    [why] = PAY.money.over_limit(facts)
    assert why.startswith("amount ") and "is not an amount the limits can be checked on" in why


def test_a_money_policy_without_an_approval_step_to_ask_is_refused_when_declared():
    from ledger.policy import CurrencyLimit, MoneyPolicy

    policy = MoneyPolicy(limits={"EUR": CurrencyLimit(each=Decimal("1"), total=Decimal("5"))})
    with pytest.raises(ValueError, match="a money policy needs the approval step"):
        registry.Dispatch("pay", connector="payments", money=policy)


def test_a_running_limit_below_the_per_effect_limit_is_refused_when_declared():
    from ledger.policy import CurrencyLimit, MoneyPolicy

    with pytest.raises(ValueError, match="running total limit below"):
        MoneyPolicy(limits={"EUR": CurrencyLimit(each=Decimal("10"), total=Decimal("5"))})


def test_a_dispatch_that_names_an_approval_without_a_money_policy_always_needs_it():
    refund = registry.get("refund_request").step_as("pay_refund", registry.Dispatch)
    assert refund.approval == "approve"
    assert refund.money is not None and refund.money.reference_of({"order_id": "A-1"}) == "order:A-1"
