"""Resuming an ended task from a chosen checkpoint version, in a real headless browser (issue 26)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from audit.models import TransitionEvent
from tasks import services
from tasks.models import Task
from tasks.states import State
from tests.api.test_fork import ended
from tests.console.test_accessibility_browser import blocking
from tests.console.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_resumes_a_failed_task_from_version_two_with_a_corrected_amount(
    page: Page, live_server, acme, operator
):
    old = ended(acme)
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/tasks/{old.id}/?checkpoint=2#checkpoint")
    card = page.locator("section.checkpoint")
    expect(card.get_by_role("heading", name="Resume from this version")).to_be_visible()
    assert blocking(page) == []  # the control passes axe, like every console page

    # The server refuses it unconfirmed: nothing started, the reason kept.
    card.get_by_label("Input amount").fill("8.00")
    card.get_by_label("Reason to resume from this version").fill("the amount was mistyped")
    card.get_by_role("button", name="Resume from v2 as a new task").click()
    # The browser's own check stops an unticked required box before it is sent.
    assert not Task.objects.filter(rerun_of=old).exists()

    card.get_by_label("Yes, start a new task from checkpoint v2").check()
    card.get_by_role("button", name="Resume from v2 as a new task").click()
    expect(page.get_by_role("status")).to_contain_text("Resumed from checkpoint v2")
    new = Task.objects.get(rerun_of=old)
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{new.id}/")
    expect(page.locator("section.reruns")).to_contain_text("from its checkpoint v2")
    assert services.task_input(new)["amount"] == "8.00"
    assert services.latest_checkpoint(new).step == "ask_customer"

    # Both histories: the original names the fork in its timeline and stays failed.
    page.locator("section.reruns").get_by_role("link").first.click()
    expect(page.locator("ol.timeline")).to_contain_text(str(new.id))
    stored = Task.objects.get(pk=old.pk)
    assert stored.state == State.FAILED
    assert TransitionEvent.objects.get(task=old, trigger="fork").reason_code == "forked"
