"""The whole login of an approver in chromium: password, enrollment from the secret shown, the
recovery codes, the inbox; then, signed out and in again, the code page with a code computed from
the same secret. Each second-factor page has no serious accessibility violation."""

from __future__ import annotations

import re

import pytest
from django_otp.plugins.otp_totp.models import TOTPDevice
from playwright.sync_api import Page, expect

from tests.console.test_accessibility_browser import blocking
from tests.second_factor import code_for, key_of, totp_code

pytestmark = pytest.mark.django_db(transaction=True)


def password(page: Page, base: str, username: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw")
    page.get_by_role("button", name="Log in").click()


def test_an_approver_enrolls_and_later_signs_in_with_a_code_from_the_secret(
    page: Page, live_server, approver
):
    base = live_server.url
    password(page, base, "acme-approver")
    expect(page).to_have_url(re.compile(re.escape(f"{base}/accounts/second-factor/enroll/")))
    expect(page.locator(".qr svg")).to_be_visible()
    expect(page.locator("#totp-uri")).to_contain_text("otpauth://totp/")
    expect(page.get_by_role("link", name="Queue")).to_have_count(0)  # no console before the code
    assert blocking(page) == []

    secret = page.locator("#totp-secret").inner_text()
    page.get_by_label("Code from your authenticator app").fill(totp_code(key_of(secret)))
    page.get_by_role("button", name="Confirm").click()
    expect(page.locator("#recovery-codes li")).to_have_count(10)
    assert blocking(page) == []
    page.get_by_role("link", name="Continue").click()
    expect(page).to_have_url(f"{base}/console/approvals/")

    page.get_by_role("button", name="Log out").click()
    password(page, base, "acme-approver")
    expect(page).to_have_url(re.compile(re.escape(f"{base}/accounts/second-factor/?")))
    assert blocking(page) == []
    page.goto(f"{base}/console/")  # typed into the address bar: back to the code page
    expect(page).to_have_url(re.compile(re.escape(f"{base}/accounts/second-factor/?")))
    device = TOTPDevice.objects.get(user=approver, confirmed=True)
    page.get_by_label("Code from your authenticator app").fill(code_for(device))
    page.get_by_role("button", name="Verify").click()
    # The console's root names no particular page: an approver lands on the inbox (console.views.landing).
    expect(page).to_have_url(f"{base}/console/approvals/")
    expect(page.get_by_role("link", name="Queue")).to_be_visible()
