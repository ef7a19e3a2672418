"""The orphan effects page in a real browser: an operator reaches it from the navigation after a
restore, reads the orphans and the restore recorded, and axe finds nothing serious (both themes)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.console.test_accessibility_browser import ARTIFACTS, PHONE, blocking, log_in
from tests.console.test_orphans import orphan, restore_record

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_operator_follows_the_nav_to_the_orphans_and_the_restore_recorded(
    page: Page, live_server, acme, operator
):
    orphan(acme, "k2.1.lost:pay:0")
    restore_record(acme, anchor="anchor-20261201T090000000000Z.jsonl")
    log_in(page, live_server.url, "acme-operator")
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Orphans").click()
    expect(page.locator("main h1")).to_have_text("Orphan effects")
    expect(page.locator("main table.orphans tbody tr")).to_have_count(1)
    expect(page.locator("main table.orphans")).to_contain_text("k2.1.lost:pay:0")
    row = page.locator("main table.restores tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("anchor-20261201T090000000000Z.jsonl")
    expect(page.get_by_role("link", name="Orphans")).to_have_attribute("aria-current", "page")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_orphans_page_has_no_serious_accessibility_violation(
    browser: Browser, live_server, acme, operator, theme
):
    orphan(acme, "k2.1.lost:pay:0")
    restore_record(acme)
    context = browser.new_context(color_scheme=theme)
    page = context.new_page()
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/orphans/")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"orphans-{theme}.png", full_page=True)
    problems = blocking(page)
    context.close()
    assert problems == []


def test_the_orphans_page_fits_a_phone_without_sideways_scrolling(
    browser: Browser, live_server, acme, operator
):
    orphan(acme, "k2.1.lost:pay:0")
    restore_record(acme, anchor="anchor-20261201T090000000000Z.jsonl")
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/orphans/")
    width = page.evaluate("document.documentElement.scrollWidth")  # tables scroll in their own box
    context.close()
    assert width <= PHONE["width"]
