"""An operator bulk-cancels a filtered set in a real headless browser (Debian's chromium)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tasks.models import Task
from tasks.states import State
from tests.conftest import REFUND_INPUT, make_task
from tests.console.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_searches_filters_bulk_cancels_with_a_reason_and_reads_the_report(
    page: Page, live_server, acme, operator
):
    outage = [
        make_task(acme, objective=f"Refund via Stripe {n}", input={**REFUND_INPUT, "order_id": f"ST-{n}"})
        for n in range(3)
    ]
    spared = make_task(acme, objective="Refund via bank transfer")
    log_in(page, live_server.url, "acme-operator")

    page.get_by_label("Search").fill("stripe")
    page.get_by_label("State", exact=True).select_option("ready")
    page.get_by_role("button", name="Filter", exact=True).click()
    rows = page.locator("table.queue tbody tr")
    expect(rows).to_have_count(3)

    page.get_by_label("Bulk action").select_option("cancel")
    page.get_by_role("button", name="Preview for everything matching this filter").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Bulk cancel: 3 tasks")
    page.get_by_role("button", name="Confirm: cancel 3 tasks").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Bulk cancel: 3 tasks")  # required reason
    page.get_by_label("Reason (required, recorded on every task)").fill("Stripe outage, INC-42")
    page.get_by_role("button", name="Confirm: cancel 3 tasks").click()

    expect(page.locator("#bulk-status")).to_have_text("Done")
    expect(page.locator("table.results tbody tr")).to_have_count(3)
    expect(page.locator("table.results")).to_contain_text("Applied")
    expect(page.get_by_text("Stripe outage, INC-42")).to_be_visible()
    assert {t.state for t in Task.objects.filter(id__in=[t.id for t in outage])} == {State.CANCEL_REQUESTED}
    assert Task.objects.get(pk=spared.id).state == State.READY
