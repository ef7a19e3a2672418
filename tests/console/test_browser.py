"""The approver's journey in a real headless browser (Debian's chromium via Playwright)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from approvals import services as approvals
from approvals.models import ApprovalRequest
from tasks import checkpoints, decisions, registry
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tests.conftest import make_task, make_user
from tests.second_factor import browser_log_in

pytestmark = pytest.mark.django_db(transaction=True)


def waiting_for_approval(tenant, owner) -> Task:
    """A refund whose workflow reached the approval step (built the way a worker builds it)."""
    task = make_task(tenant, owner=owner, objective="Refund order A-1: a cracked vase")
    kind = registry.get(task.task_type)
    now = timezone.now()
    facts = {
        **kind.initial_facts(task.input),
        "order_status": "delivered",
        "order_total": "100.00",
        "refund_card": "visa-4242",
        "triage": "refund",
        "damaged_item": "vase",
        "return_tracking": "T-1",
    }
    progress = checkpoints.Progress(
        step="approve",
        facts=facts,
        evidence=[
            checkpoints.EvidenceRef(system="orders", record_id="A-1", record_version="1", fetched_at=now)
        ],
    )
    worker = Actor.worker("browser-test")
    task = advance(task.id, 1, State.READY, actor=worker, trigger=Trigger.STEP, progress=progress)
    ask = approvals.request_decision(task, kind, kind.step("approve"), progress, now=now)
    return decisions.commit(task, ask, actor=worker)


def log_in(page: Page, base: str, username: str, lands_on: str = "/console/") -> None:
    """Log in (with the second factor when asked); approvers land on their inbox
    (``/console/approvals/``), everyone else on the queue."""
    browser_log_in(page, base, username)
    expect(page).to_have_url(f"{base}{lands_on}")


def test_an_approver_approves_from_the_inbox_and_sees_the_task_move_on(
    page: Page, live_server, acme, operator, approver
):
    task = waiting_for_approval(acme, owner=operator)
    log_in(page, live_server.url, "acme-approver", lands_on="/console/approvals/")

    page.get_by_role("link", name="Approvals").click()
    expect(page.get_by_role("heading", name="Approvals waiting for you")).to_be_visible()
    row = page.locator("table.grid tbody tr", has_text="Refund order A-1")
    expect(row).to_contain_text("amount=10.00")
    row.locator("a.request-link").click()  # the link is on the request itself

    expect(page.get_by_role("heading", name="Approve payments: refund?")).to_be_visible()
    request = ApprovalRequest.objects.get(task=task)
    expect(page.locator("code.digest")).to_have_text(request.digest)
    # The card is shown masked (stored sealed); the digest binds its clear value.
    expect(page.locator("dl.facts").first).to_contain_text("•••• 4242")
    expect(page.get_by_text("visa-4242")).to_have_count(0)
    page.get_by_label("Comment").fill("Photos of the vase check out.")
    page.get_by_role("button", name="Approve").click()
    page.get_by_role("button", name="Confirm approval").click()

    expect(page.get_by_role("status")).to_contain_text("Approved. The task moved on to resume_validation.")
    # On to the inbox (nothing else waits), not the operator's task page.
    expect(page.get_by_role("heading", name="Approvals waiting for you")).to_be_visible()
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    expect(page.get_by_role("heading", level=1)).to_contain_text("Resume Validation")
    expect(page.locator("ol.timeline")).to_contain_text("approval_decided by user:acme-approver")
    assert Task.objects.get(pk=task.pk).state == State.RESUME_VALIDATION
    assert ApprovalRequest.objects.get(pk=request.pk).status == "approved"


def test_an_expired_request_says_so_and_offers_no_decision(page: Page, live_server, acme, operator, approver):
    task = waiting_for_approval(acme, owner=operator)
    ApprovalRequest.objects.filter(task=task).update(expires_at=timezone.now() - timedelta(minutes=5))
    request = ApprovalRequest.objects.get(task=task)
    log_in(page, live_server.url, "acme-approver", lands_on="/console/approvals/")

    page.goto(f"{live_server.url}/console/approvals/{request.pk}/")
    expect(page.get_by_role("alert")).to_contain_text("This request expired")
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    page.goto(f"{live_server.url}/console/approvals/")
    expect(page.get_by_text("Nothing waits for your decision.")).to_be_visible()


def test_an_approver_opens_a_repeat_request_sees_the_diff_and_approves_with_confirmation(
    page: Page, live_server, acme, operator, approver
):
    from tests.console.test_approvals import ask

    task = make_task(acme, owner=operator, objective="Refund order A-1: a cracked vase")
    first = ask(task)
    # Rejected by another approver: who decided the earlier request may not decide its repeat (issue 20).
    other = make_user("acme-approver2", acme, Role.APPROVER)
    approvals.approval_decide(first, user=other, decision="reject", digest_seen=first.digest)
    second = ask(Task.objects.get(pk=task.pk), trigger=Trigger.PROCEED, amount="8.00")
    log_in(page, live_server.url, "acme-approver", lands_on="/console/approvals/")

    expect(page.locator("span.pending-count")).to_have_text("1")
    page.locator("table.grid tbody tr", has_text="Refund order A-1").locator("a.request-link").click()
    expect(page.get_by_role("heading", name="This repeats an earlier request")).to_be_visible()
    diff = page.locator("table.diff")
    expect(diff.locator("tr", has_text="effect.amount")).to_contain_text("8.00")
    expect(page.get_by_role("link", name="rejected by acme-approver2", exact=False)).to_be_visible()

    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("heading", name="Confirm the approval")).to_be_visible()
    assert ApprovalRequest.objects.get(pk=second.pk).status == "pending"
    page.get_by_role("button", name="Confirm approval").click()
    expect(page.get_by_role("status")).to_contain_text("Approved.")
    assert ApprovalRequest.objects.get(pk=second.pk).status == "approved"
