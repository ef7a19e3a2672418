"""An approver decides an SDK agent's tool call in a real headless browser (Debian's chromium).

The support agent runs for real up to its pause (the in-process resume loop, the sandbox over HTTP):
the page the approver sees is the request the runtime raised for the agent's call, and approving it
there is what lets the refund be sent, once.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from approvals.models import ApprovalRequest
from demo.sandbox.models import Effect
from tasks.states import State
from tests.console.test_agent_turns import run_until_still, support_task
from tests.console.test_browser import log_in
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10  # a loaded machine (a browser starting) is not what these test
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1", total="500.00", card="visa-4242")


def test_an_approver_sees_the_agent_tool_call_and_approves_it(
    page: Page, live_server, acme, operator, approver
):
    task = run_until_still(support_task(acme, "150.00"))  # in a thread: see off_the_loop
    assert task.state == State.WAITING_APPROVAL, task.state_reason
    request = ApprovalRequest.objects.get(task=task)
    assert request.step == "refund_order#call_2_refund_order:approve"

    log_in(page, live_server.url, "acme-approver", lands_on="/console/approvals/")
    page.goto(f"{live_server.url}/console/approvals/{request.pk}/")

    call = page.locator("#agent-call")
    expect(call.get_by_role("heading", name="The agent's call")).to_be_visible()
    expect(call.locator("dt")).to_have_text(["Agent", "Tool", "Call", "Arguments"])
    shown = call.locator("dd")
    expect(shown).to_have_text(["support", "refund_order", "call_2_refund_order", re.compile("order_id=A-1")])
    arguments = shown.nth(3)
    for argument in ("order_id=A-1", "amount=150.00", "currency=USD", "card=•••• 4242"):
        expect(arguments).to_contain_text(argument)  # the card is sensitive: sealed, shown masked
    expect(page.get_by_text("visa-4242")).to_have_count(0)
    expect(page.locator("code.digest")).to_have_text(request.digest)

    page.get_by_label("Comment").fill("The order is worth 500; 150 back is fine.")
    page.get_by_role("button", name="Approve").click()
    page.get_by_role("button", name="Confirm approval").click()
    expect(page.get_by_role("status")).to_contain_text("Approved. The task moved on to")
    assert ApprovalRequest.objects.get(pk=request.pk).status == "approved"

    task = run_until_still(task)
    assert task.state == State.COMPLETED, task.state_reason
    refunds = Effect.objects.filter(system="payments")
    assert refunds.count() == 1 and refunds.get().request["amount"] == "150.00"

    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    turns = page.locator("#agent-turns tr.turn")
    expect(turns).to_have_count(4)
    expect(turns.nth(1)).to_contain_text("refund_order (call_2_refund_order) → succeeded")
    expect(turns.nth(1).get_by_role("link", name="approval approved")).to_be_visible()
    expect(turns.nth(3)).to_contain_text("answered")
