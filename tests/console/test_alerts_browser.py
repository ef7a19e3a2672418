"""The alerts page in a real browser: it renders with data, its badge agrees with it, a person can
acknowledge and snooze through the confirmed forms, and axe finds nothing serious (both themes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from playwright.sync_api import Browser, Page, expect

from runtime import alerts
from runtime.models import Alert
from tasks.models import Task
from tests.conftest import make_task
from tests.console.test_accessibility_browser import ARTIFACTS, blocking, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def stuck_alerts(acme, n: int) -> list[Alert]:
    from django.utils import timezone

    for k in range(n):
        task = make_task(acme, objective=f"Refund order S-{k}")
        Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - timedelta(hours=3))
    alerts.scan()
    return list(Alert.objects.order_by("-id"))


def badge(page: Page):
    return page.locator('header nav a[href="/console/alerts/"] .pending-count')


def test_an_operator_acknowledges_and_snoozes_and_the_badge_follows(page: Page, live_server, acme, operator):
    newest, second, _ = stuck_alerts(acme, 3)
    log_in(page, live_server.url, "acme-operator")
    expect(badge(page)).to_have_text("3")
    page.get_by_role("link", name="Alerts").click()
    expect(page.locator("main h1")).to_have_text("Alerts")
    expect(page.locator("main table.alerts tbody tr")).to_have_count(3)
    expect(page.locator("main p.muted strong").first).to_have_text("3")

    row = page.locator(f"#alert-{newest.id}")
    row.get_by_text("Acknowledge…").click()
    row.get_by_label("What you are doing about it").fill("restarting the region's workers")
    row.get_by_label(f"Yes, acknowledge alert #{newest.id}").check()
    row.get_by_role("button", name="Acknowledge").click()
    expect(page.get_by_role("status")).to_contain_text(f"Alert #{newest.id} acknowledged.")
    expect(page.locator(f"#alert-{newest.id}")).to_contain_text("acknowledged by acme-operator")
    expect(badge(page)).to_have_text("2")

    row = page.locator(f"#alert-{second.id}")
    row.get_by_text("Snooze…").click()
    row.get_by_label("Snooze for").select_option("1d")
    row.get_by_label("Yes, hide it from the badge until then").check()
    row.get_by_role("button", name="Snooze").click()
    expect(page.get_by_role("status")).to_contain_text(f"Alert #{second.id} snoozed until")
    expect(badge(page)).to_have_text("1")
    expect(page.locator("main p.muted strong").first).to_have_text("1")


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_alerts_page_has_no_serious_accessibility_violation(
    browser: Browser, live_server, acme, operator, theme
):
    first, *_ = stuck_alerts(acme, 2)
    alerts.acknowledge(first, user=operator, note="looking")
    context = browser.new_context(color_scheme=theme)
    page = context.new_page()
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/alerts/")
    for summary in page.locator("main details summary").all():
        summary.click()  # the forms and histories open, so axe checks them too
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=ARTIFACTS / f"alerts-{theme}.png", full_page=True)
    problems = blocking(page)
    context.close()
    assert problems == []
