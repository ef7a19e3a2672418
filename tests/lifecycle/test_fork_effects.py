"""A fork resumed from a checkpoint asks every approval again and never pays twice blindly (issue 26).

Run by the in-process resume loop against the sandbox's payments system over live HTTP, as the rerun
tests are (``test_rerun_effects``): a fork carries the checkpoint's step and facts but not the ledger
and not the approvals. Reaching the payment its original made, with the same effect, it reuses the
outcome and sends nothing; with a corrected amount it goes to an approver, who sees the earlier
payment; from a point past an approval, the approval is asked again of the fork.
"""

from __future__ import annotations

import json

import pytest

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from ledger.models import Action
from tasks.models import Task
from tasks.states import State
from tests.conftest import api_client_for
from tests.lifecycle.test_rerun_effects import invoice_payments, start
from tests.runtime.payments import run
from tests.workflow import approve

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.LEDGER_LOOKUP_INTERVAL = 0


def fork(operator, task: Task, version: int, **body) -> Task:
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/fork/",
        json.dumps({"version": version, "reason": "resume", **body}),
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


def test_a_fork_reaching_the_same_payment_reuses_it(operator, acme):
    old = start(operator, invoice="INV-F1", amount="400.00")
    assert old.state == State.COMPLETED and len(invoice_payments("INV-F1")) == 1
    new = run(fork(operator, old, 1))
    assert new.state == State.COMPLETED
    [paid] = invoice_payments("INV-F1")  # still one payment
    assert new.outcome["payment_ref"] == str(paid.pk)
    assert not Action.objects.filter(task=new).exists()  # nothing intended, nothing sent
    assert TransitionEvent.objects.filter(task=new, reason_code="effect_reused").exists()


def test_a_fork_with_a_corrected_amount_goes_to_an_approver_first(operator, acme):
    old = start(operator, invoice="INV-F2", amount="400.00")
    new = run(fork(operator, old, 1, input={"amount": "450.00"}))
    assert new.state == State.WAITING_APPROVAL  # the invoice was paid by its original: asked, not sent
    [request] = ApprovalRequest.objects.filter(task=new)
    assert request.status == "pending"
    assert len(invoice_payments("INV-F2")) == 1


def test_an_approval_given_to_the_original_is_asked_again_of_the_fork(operator, approver, acme):
    old = start(operator, invoice="INV-F3", amount="1500.00")  # above the limit: an approver first
    assert old.state == State.WAITING_APPROVAL
    asked_at = old.state_version
    approve(old, approver)
    old = run(Task.objects.get(pk=old.pk))
    assert old.state == State.COMPLETED and len(invoice_payments("INV-F3")) == 1
    originals = list(ApprovalRequest.objects.filter(task=old).values_list("pk", "status"))

    new = run(fork(operator, old, asked_at, input={"amount": "1400.00"}))
    assert new.state == State.WAITING_APPROVAL
    [request] = ApprovalRequest.objects.filter(task=new)  # a new request, nothing copied
    assert request.status == "pending" and request.pk not in {pk for pk, _ in originals}
    assert list(ApprovalRequest.objects.filter(task=old).values_list("pk", "status")) == originals
    assert len(invoice_payments("INV-F3")) == 1  # nothing paid for the fork before its approval
