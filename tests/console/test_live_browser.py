"""The live refresh in a real browser: htmx from our own static files, rows re-read without a reload."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.console.test_browser import log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_queue_loads_htmx_and_a_changed_task_updates_its_row_in_place(
    page: Page, live_server, acme, operator
):
    task = make_task(acme, objective="Live refund")
    scripts = []
    page.on("request", lambda r: scripts.append(r.url) if r.resource_type == "script" else None)
    log_in(page, live_server.url, "acme-operator")

    assert any(url.startswith(live_server.url) and "htmx" in url for url in scripts), scripts
    assert all(url.startswith(live_server.url) for url in scripts), "no script from a CDN"
    # Loaded (above), then run: a deferred script runs after the page is parsed, not when it arrives.
    # A function, not an expression: Playwright polls an expression with eval, which the CSP refuses.
    page.wait_for_function("() => typeof window.htmx === 'object'", timeout=10_000)
    indicator = page.locator("[data-live]")
    expect(indicator).to_be_visible()
    expect(indicator).to_contain_text("Live")

    row = page.locator("#queue-rows tr", has_text="Live refund")
    expect(row).to_contain_text("v1")
    page.evaluate("window.__notReloaded = true")
    advance(task.id, 1, State.QUARANTINED, actor=Actor.system("browser-test"), reason_code="step_error")
    expect(row).to_contain_text("Quarantined", timeout=15_000)
    expect(row).to_contain_text("v2")
    assert page.evaluate("window.__notReloaded") is True, "the page reloaded instead of refreshing its rows"
    expect(indicator).to_contain_text("updated")

    # Paused: nothing is re-read while the operator reads.
    indicator.get_by_role("button", name="Pause").click()
    expect(indicator.get_by_role("button", name="Resume")).to_have_attribute("aria-pressed", "true")
    requests = []
    page.on("request", lambda r: requests.append(r.url) if r.headers.get("hx-request") else None)
    page.wait_for_timeout(6_000)
    assert requests == []


def test_a_task_page_refreshes_until_the_task_ends(page: Page, live_server, acme, operator):
    task = make_task(acme, objective="Live task page")
    log_in(page, live_server.url, "acme-operator")
    page.goto(f"{live_server.url}/console/tasks/{task.id}/")
    indicator = page.locator("[data-live]")
    expect(indicator).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    advance(
        task.id, 1, State.FAILED, actor=Actor.worker("browser-test"), trigger=Trigger.FAIL, reason="gave up"
    )
    expect(page.get_by_role("heading", level=1)).to_contain_text("Failed", timeout=15_000)
    expect(page.locator("#task-live-timeline")).to_contain_text("v2")
    expect(page.get_by_text("This task changed since you opened the page")).to_be_visible()
    expect(indicator).to_contain_text("Finished")
    assert page.evaluate("window.__notReloaded") is True
    # A terminal task's page has no live refresh at all.
    page.reload()
    expect(page.locator("[data-live]")).to_have_count(0)
    assert page.locator("[hx-trigger]").count() == 0


def test_an_htmx_refresh_of_the_queue_renders_only_its_rows(client, acme, operator):
    make_task(acme, objective="Partial refund")
    client.force_login(operator)
    response = client.get("/console/?state=ready", headers={"HX-Request": "true"})
    body = response.content.decode()
    assert '<tbody id="queue-rows"' in body
    assert "Partial refund" in body and "<html" not in body and "Saved views" not in body
    assert 'hx-get="/console/?state=ready"' in body
    assert "HX-Request" in response["Vary"]
    # Without htmx: the whole page, the same rows inside it.
    full = client.get("/console/?state=ready").content.decode()
    assert "<html" in full and "Partial refund" in full and "htmx-2.min.js" in full
