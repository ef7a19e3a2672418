"""The operator's journey on the task page in a real headless browser (Debian's chromium)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress
from tests.console.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_releases_a_quarantined_task_answers_one_and_reruns_another(
    page: Page, live_server, acme, operator
):
    held = advance(
        make_task(acme, objective="Refund order A-1: held").id,
        1,
        State.QUARANTINED,
        actor=Actor.system("runner"),
        reason="triage raised KeyError: 'total'",
        reason_code="step_error",
    )
    asking = advance(
        make_task(acme, objective="Refund order A-2: asking").id,
        1,
        State.WAITING_INPUT,
        actor=Actor.worker("w"),
        trigger=Trigger.REQUEST_INPUT,
        progress=progress("ask_customer", order_id="A-2"),
        wait_deadline=timezone.now() + timedelta(hours=1),
    )
    ended = advance(
        make_task(acme, objective="Refund order A-3: declined").id,
        1,
        State.FAILED,
        actor=Actor.worker("w"),
        trigger=Trigger.FAIL,
        reason="payments declined",
    )
    log_in(page, live_server.url, "acme-operator")

    # 1. Why is it held? Release it with a reason.
    page.goto(f"{live_server.url}/console/tasks/{held.id}/")
    why = page.locator("section.why")
    expect(why).to_contain_text("triage raised KeyError: 'total'")
    expect(why).to_contain_text("an operator must act")
    expect(page.locator("#help-release")).to_contain_text("a step raised an error last time")
    page.get_by_label("Reason to release").fill("fix for the triage step is deployed")
    page.get_by_role("button", name="Release", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Release applied; the task is now resume_validation")
    expect(page.locator("ol.timeline")).to_contain_text("fix for the triage step is deployed")
    assert Task.objects.get(pk=held.pk).state == State.RESUME_VALIDATION

    # 2. Answer the question a waiting task asks.
    page.goto(f"{live_server.url}/console/tasks/{asking.id}/")
    expect(page.locator("section.why")).to_contain_text("an answer to “Which item was damaged?”")
    page.get_by_label("Which item was damaged?").fill("the blue vase")
    page.get_by_role("button", name="Send answer").click()
    expect(page.get_by_role("status")).to_contain_text("Answer recorded")
    assert Task.objects.get(pk=asking.pk).state == State.RESUME_VALIDATION

    # 3. Rerun a failed task: a new task, linked both ways; the old one stays failed.
    page.goto(f"{live_server.url}/console/tasks/{ended.id}/")
    page.get_by_label("Reason to rerun").fill("the card was replaced")
    page.get_by_role("button", name="Rerun as a new task").click()
    expect(page.get_by_role("status")).to_contain_text("Rerun started")
    rerun = Task.objects.get(rerun_of=ended)
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{rerun.id}/")
    page.locator("section.reruns").get_by_role("link").click()
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{ended.id}/")
    expect(page.locator("section.reruns")).to_contain_text("Rerun as:")
    assert (Task.objects.get(pk=ended.pk).state, Task.objects.get(pk=ended.pk).state_version) == (
        State.FAILED,
        2,
    )
