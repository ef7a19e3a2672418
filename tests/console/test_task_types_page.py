"""The task-types page (``/console/task-types/``): what each persona can start, read off the contract.

Its axe checks in both themes and at phone width are those of every console page
(tests/console/test_accessibility_browser.py); its query ceiling is in test_query_counts.py.
"""

from __future__ import annotations

import re

import pytest
from django.test import Client
from playwright.sync_api import Browser, expect

from reads import task_types
from tasks import registry
from tests.conftest import make_user
from tests.console.test_accessibility_browser import blocking, log_in

pytestmark = pytest.mark.django_db

PAGE = "/console/task-types/"
PERSONAS = ["operator", "approver", "auditor", "admin_user", "integrator", "outsider"]


def page_for(user, path: str = PAGE) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def section(page: str, name: str) -> str:
    """The HTML of one type's section."""
    start = page.index(f'<section class="card task-type" id="type-{name}"')
    return page[start : page.index("</section>", start)]


def text(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


@pytest.mark.parametrize("who", PERSONAS)
def test_every_persona_sees_every_type_with_its_description_and_version(who, request):
    page = page_for(request.getfixturevalue(who))
    for contract in task_types.contracts():
        shown = section(page, contract.name)
        assert contract.description in text(shown)
        assert contract.version in shown
        assert f'href="#type-{contract.name}"' in page  # the index links to it


def test_input_fields_show_type_and_rules_and_mark_the_sensitive_ones(operator):
    refund = section(page_for(operator), "refund_request")
    rows = {
        text(row).split()[0]: row
        for row in re.findall(r"<tr[^>]*>\s*<th scope=\"row\">.*?</tr>", refund, flags=re.S)
    }
    assert 'class="tag-sensitive"' in rows["customer_email"] and "sensitive" in text(rows["customer_email"])
    assert 'class="tag-sensitive"' not in rows["order_id"]
    assert "at most 200 characters" in text(rows["order_id"])
    assert "refund_card" in text(refund.split('class="derived"')[1])  # a derived fact, sealed too


def test_steps_are_listed_in_order_with_what_each_does(operator):
    refund = text(section(page_for(operator), "refund_request"))
    steps = registry.get("refund_request").steps
    positions = [refund.index(f"{step.name} {type(step).__name__}") for step in steps]
    assert positions == sorted(positions)
    assert "asks a person: Which item was damaged?" in refund


def test_a_refund_always_asks_and_a_payment_only_above_its_limits(operator):
    page = page_for(operator)
    refund = text(section(page, "refund_request"))
    assert "pay_refund through payments approver Always" in refund
    assert "expires after" in refund and "a day" in refund
    payment = text(section(page, "pay_invoice"))
    assert "Above its limits" in payment
    assert "USD: above 1000 at once, or past 5000 in" in payment


def test_an_agents_tool_that_asks_is_shown_per_call(operator):
    if "support_agent" not in registry.names():
        pytest.skip("the agents extra is not installed")
    agent = text(section(page_for(operator), "support_agent"))
    assert "refund_order" in agent and "each call of the agent's tool (step agent )" in agent


def test_someone_with_no_role_sees_no_type(acme):
    page = page_for(make_user("nobody"))
    assert "no task type is shown" in page
    assert 'class="card task-type"' not in page


def test_an_anonymous_visitor_is_sent_to_log_in():
    response = Client().get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_navigation_links_the_page_and_marks_it_current(operator):
    assert '<a href="/console/task-types/" >Task types</a>' in page_for(operator, "/console/")
    assert '<a href="/console/task-types/" aria-current="page">Task types</a>' in page_for(operator)


@pytest.mark.django_db(transaction=True)
def test_the_page_is_reached_from_the_navigation_and_passes_axe_in_the_chosen_dark_theme(
    browser: Browser, live_server, acme, operator
):
    """The toggle's dark theme (``data-theme``), not the browser's scheme the every-page check emulates."""
    page = browser.new_context(color_scheme="light").new_page()
    log_in(page, live_server.url, "acme-operator")
    page.get_by_role("button", name="Dark").click()
    page.get_by_role("navigation", name="Console").get_by_role("link", name="Task types").click()
    expect(page.locator("main h1")).to_have_text("Task types")
    expect(page.locator("html")).to_have_attribute("data-theme", "dark")
    page.get_by_role("navigation", name="Task types").get_by_role("link", name="pay_invoice").click()
    expect(page).to_have_url(re.compile(r"#type-pay_invoice$"))
    expect(page.get_by_role("heading", name="pay_invoice", level=2)).to_be_in_viewport()
    assert blocking(page) == []
    page.context.close()
