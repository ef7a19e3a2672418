"""The demo's login page, with its list of demo users, in a real browser: readable in both themes with no
serious accessibility violation, and the names on it are the accounts that exist."""

from __future__ import annotations

import pytest
from playwright.sync_api import Browser, expect

from tenancy.models import Role
from tests.conftest import make_user
from tests.console.test_accessibility_browser import blocking

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_the_login_page_names_the_demo_users_accessibly(browser: Browser, live_server, settings, acme, theme):
    settings.DEBUG = True  # a development run, as make demo's (the test runner turns it off)
    make_user("acme-operator", acme, Role.OPERATOR)
    make_user("acme-approver", acme, Role.APPROVER)
    context = browser.new_context(color_scheme=theme)
    page = context.new_page()
    page.goto(f"{live_server.url}/accounts/login/")
    users = page.get_by_role("region", name="Demo users")
    expect(users).to_contain_text("acme-operator: operator")
    expect(users).to_contain_text("acme-approver: approver")
    expect(users).not_to_contain_text("globex-")
    assert blocking(page) == []
    context.close()
