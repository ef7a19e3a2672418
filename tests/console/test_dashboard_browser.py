"""The dashboard in a real browser: its charts draw under the Content-Security-Policy; it refreshes live."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from runtime import rollups
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.console.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_dashboard_draws_its_charts_and_refreshes_without_a_reload(
    page: Page, live_server, acme, operator, settings
):
    for n in range(3):
        make_task(acme, objective=f"Dashboard task {n}")
    rollups.refresh()  # the beat's recount: the page serves the stored reading
    refused = []
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    log_in(page, live_server.url, "acme-operator")
    page.get_by_role("link", name="Dashboard").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Dashboard")

    ready = page.locator("table.by-state tr", has_text="Ready")
    expect(ready.locator("td.num").last).to_have_text("3")
    bar = ready.locator("svg.bar rect")
    expect(bar).to_have_count(1)
    assert float(bar.get_attribute("width") or 0) == 100.0  # the largest state spans the whole bar
    box = ready.locator("svg.bar").bounding_box()
    assert box is not None and box["width"] > 50, "the bar is drawn at the table's width"
    expect(page.locator("svg.spark polyline")).to_have_count(1)

    page.evaluate("window.__notReloaded = true")
    task = make_task(acme, objective="One more")
    advance(task.id, 1, State.QUARANTINED, actor=Actor.system("browser-test"), reason_code="step_error")
    rollups.refresh()  # the next recount: the live refresh shows it without a reload
    expect(page.locator("table.by-state tr", has_text="Quarantined")).to_be_visible(timeout=15_000)
    expect(page.locator("[data-live]")).to_contain_text("updated")
    assert page.evaluate("window.__notReloaded") is True, "the page reloaded instead of refreshing"
    assert refused == [], refused
