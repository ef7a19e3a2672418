"""axe-core on every console page in the real browser, both themes, plus the 390 px phone width.

axe's script comes from the ``axe-playwright-python`` wheel (``axe.min.js`` is
read from disk; nothing is fetched). A page passes with no violation of
"serious" or "critical" impact. Every page is also saved as a screenshot under
``test-artifacts/`` (desktop and phone width) for a person to look at.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, expect

from runtime import bulk
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tests.conftest import make_task, make_user
from tests.second_factor import browser_log_in

pytestmark = pytest.mark.django_db(transaction=True)

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
BLOCKING = {"serious", "critical"}
PHONE = {"width": 390, "height": 844}


def console_pages(acme, owner) -> dict[str, str]:
    """A small world with something on every page, and the console path of each page."""
    from tests.console.test_approvals import ask

    approval = ask(make_task(acme, owner=owner, objective="Refund order A-1: a cracked vase"))
    held = make_task(acme, objective="Refund order B-2: held for a look")
    advance(held.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="step_error", reason="boom")
    gave_up = make_task(acme, objective="Refund order D-3: declined")
    advance(gave_up.id, 1, State.FAILED, actor=Actor.worker("t"), trigger=Trigger.FAIL, reason_code="no")
    batch = [make_task(acme, objective=f"Refund order C-{n}") for n in range(3)]
    operation = bulk.bulk_create(
        user=owner,
        control="cancel",
        reason="Stripe outage, INC-42",
        tasks=Task.objects.filter(id__in=[t.id for t in batch[:2]]),
        selection={"query": "q=Refund+order+C"},
    )
    bulk.bulk_run(operation.id, runner="test")
    return {
        "queue": "/console/",
        "task": f"/console/tasks/{approval.task_id}/",
        "approvals": "/console/approvals/",
        "approval": f"/console/approvals/{approval.id}/",
        "quarantine": "/console/quarantine/",
        "failed": "/console/failed/",
        "dashboard": "/console/dashboard/",
        "audit": "/console/audit/",
        "audit-task": f"/console/audit/tasks/{approval.task_id}/",
        "task-types": "/console/task-types/",
        "start": "/console/start/",
        "bulk-preview": "/console/bulk/new/?control=cancel&target=all&q=Refund+order+C",
        "bulk-report": f"/console/bulk/{operation.id}/",
        "bulk-list": "/console/bulk/",
        "access": "/console/access/",
        "alerts": "/console/alerts/",
        "orphans": "/console/orphans/",
        "not-found": "/console/tasks/00000000-0000-0000-0000-000000000000/",
    }


def log_in(page: Page, base: str, username: str) -> None:
    browser_log_in(page, base, username)  # with the second factor when asked
    expect(page.locator("main h1")).to_be_visible()


def blocking(page: Page) -> list[str]:
    """Serious and critical axe violations on the page, one line per rule with its first targets."""
    results = Axe().run(page).response
    return [
        f"{v['id']} ({v['impact']}): {v['help']}\n      {node['target']} {node['failureSummary']!r}"
        for v in results["violations"]
        if v["impact"] in BLOCKING
        for node in v["nodes"][:3]
    ]


def check(page: Page, name: str, theme: str, found: dict[str, list[str]]) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    found[f"{name} ({theme})"] = blocking(page)
    page.screenshot(path=ARTIFACTS / f"{name}-{theme}.png", full_page=True)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_console_page_has_no_serious_accessibility_violation(
    browser: Browser, live_server, acme, operator, theme
):
    make_user("acme-chief", acme, Role.ADMIN, Role.APPROVER)  # sees every page, and the decide form
    pages = console_pages(acme, owner=operator)
    context = browser.new_context(color_scheme=theme)  # "auto": the theme follows the browser's scheme
    page = context.new_page()
    found: dict[str, list[str]] = {}

    page.goto(f"{live_server.url}/accounts/login/")
    check(page, "login", theme, found)
    log_in(page, live_server.url, "acme-chief")
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        check(page, name, theme, found)
    context.close()

    report = [f"{name}:\n    " + "\n    ".join(problems) for name, problems in found.items() if problems]
    assert not report, "\n".join(report)


def test_every_console_page_fits_a_phone_without_sideways_scrolling(
    browser: Browser, live_server, acme, operator
):
    make_user("acme-chief", acme, Role.ADMIN, Role.APPROVER)
    pages = console_pages(acme, owner=operator)
    context = browser.new_context(viewport=PHONE)
    page = context.new_page()
    log_in(page, live_server.url, "acme-chief")
    too_wide = {}
    for name, path in pages.items():
        page.goto(f"{live_server.url}{path}")
        page.screenshot(path=ARTIFACTS / f"{name}-390px.png", full_page=True)
        # Tables scroll inside their own box; the page itself must not.
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            too_wide[name] = width
    context.close()
    assert too_wide == {}


def test_the_queue_answers_its_keyboard_shortcuts(page: Page, live_server, acme, operator):
    tasks = [make_task(acme, objective=f"Refund order K-{n}") for n in range(3)]
    log_in(page, live_server.url, "acme-operator")

    page.keyboard.press("/")
    expect(page.locator("main form.filters :focus")).to_have_count(1)
    page.locator("body").click(position={"x": 5, "y": 5})  # leave the field: shortcuts ignore typing
    rows = page.locator("main table.grid tbody tr")
    page.keyboard.press("j")
    expect(rows.nth(0)).to_be_focused()
    page.keyboard.press("j")
    expect(rows.nth(1)).to_be_focused()
    page.keyboard.press("k")
    expect(rows.nth(0)).to_be_focused()
    page.keyboard.press("Enter")
    newest = max(tasks, key=lambda t: t.id)  # the queue lists newest first
    expect(page).to_have_url(f"{live_server.url}/console/tasks/{newest.id}/")


def test_the_skip_link_is_the_first_tab_stop_and_lands_on_the_content(
    page: Page, live_server, acme, operator
):
    log_in(page, live_server.url, "acme-operator")
    page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    expect(skip).to_be_focused()
    expect(skip).to_be_visible()
    page.keyboard.press("Enter")
    expect(page.locator("main#main")).to_be_focused()
