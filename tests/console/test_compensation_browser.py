"""Undoing what a canceled task left done, from its page, in a real headless browser."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from ledger.models import Action
from tasks.models import Task
from tasks.states import State
from tests.console.test_browser import log_in
from tests.lifecycle.booking import booking_types, canceled_booking, sandbox
from tests.runtime.payments import run

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["booking_types", "sandbox"]  # fixtures


def test_an_operator_undoes_a_booking_a_cancel_left_done_and_follows_the_links(
    page: Page, live_server, sandbox, booking_types, acme, operator
):
    task = canceled_booking(acme, operator)
    booked = Action.objects.get(task=task)
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    expect(page.locator("section.why")).to_contain_text("1 effect(s) it left done can be undone below")
    offers = page.locator("section.compensations")
    expect(offers).to_contain_text(booked.idempotency_key)
    expect(offers).to_contain_text("unbook")

    # Unticked, the browser will not send it; the reason is required too.
    offers.get_by_label("Reason to undo it").fill("the trip was called off")
    offers.get_by_role("button", name="Undo with unbook").click()
    assert not Task.objects.filter(rerun_of=task).exists()
    offers.get_by_label("Yes, send the compensating effect").check()
    offers.get_by_role("button", name="Undo with unbook").click()
    expect(page.get_by_role("status")).to_contain_text(
        f"Compensation started: this task undoes {booked.idempotency_key}"
    )
    compensating = Task.objects.get(rerun_of=task)
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{compensating.id}/")
    expect(page.locator("section.compensates")).to_contain_text(booked.idempotency_key)
    expect(page.locator("section.reruns")).to_have_count(0)  # a compensation run is not a rerun

    run(compensating)  # a worker's claim: the one step, then the end
    page.locator("section.compensates").get_by_role("link").click()
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{task.id}/")
    expect(offers.get_by_role("link")).to_have_attribute("href", f"/console/tasks/{compensating.id}/")
    expect(offers).to_contain_text(State.COMPLETED)
    expect(offers.get_by_role("button")).to_have_count(0)  # one run per effect: nothing left to start
    assert Task.objects.get(pk=task.pk).state == State.CANCELED
