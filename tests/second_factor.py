"""The second factor in tests: a TOTP code computed from a device's secret, and logging in through
the real pages (HTTP or a browser) for tests whose subject is not the second factor itself.

``client.force_login`` counts as a passed second factor (tests/conftest.py) just as it skips the
password; tests that go through the login form use ``sign_in`` or ``browser_log_in``.
"""

from __future__ import annotations

import re
import time
from base64 import b32decode
from binascii import hexlify
from typing import Any

from django.contrib.auth import get_user_model
from django.test import Client
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice
from playwright.sync_api import Page, expect

LOGIN = "/accounts/login/"
CODE_PAGE = "/accounts/second-factor/"
ENROLL_PAGE = "/accounts/second-factor/enroll/"


def totp_code(key_hex: str, *, after_step: int = -1, at: float | None = None) -> str:
    """The six digits an authenticator app shows for ``key_hex`` now (or ``at``), or for the next
    step if the current one was already used (``after_step``: a device's ``last_t``; a code is good once)."""
    totp = TOTP(bytes.fromhex(key_hex))
    totp.time = max(time.time() if at is None else at, (after_step + 1) * totp.step + 1)
    return f"{totp.token():06d}"


def code_for(device: TOTPDevice) -> str:
    device.refresh_from_db()
    return totp_code(device.key, after_step=device.last_t)


def key_of(secret_b32: str) -> str:
    """The hex key of a base32 secret as the enrollment page shows it (grouped by spaces)."""
    return hexlify(b32decode("".join(secret_b32.split()))).decode()


def device_for(user: Any) -> TOTPDevice:
    """``user``'s confirmed authenticator (created if it has none)."""
    device = TOTPDevice.objects.filter(user=user, confirmed=True).first()
    return device or TOTPDevice.objects.create(user=user, name="test authenticator", confirmed=True)


def mark_verified(client: Client, user: Any) -> None:
    """Make ``client``'s session one that has given its second factor, as a code would."""
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device_for(user).persistent_id
    session.save()


def forget_second_factor(client: Client) -> None:
    """Undo ``mark_verified``: the session has given its password, not its code."""
    session = client.session
    session.pop(DEVICE_ID_SESSION_KEY, None)
    session.save()


def sign_in(client: Client, user: Any, password: str = "pw", **extra: Any):
    """Log in through the password form and, if asked, the code page; the last response (followed)."""
    device = device_for(user)
    response = client.post(
        LOGIN, {"username": user.get_username(), "password": password}, follow=True, **extra
    )
    if response.request["PATH_INFO"] != CODE_PAGE:
        return response
    return client.post(
        CODE_PAGE, {"code": code_for(device), "next": response.context["next"]}, follow=True, **extra
    )


def browser_log_in(page: Page, base: str, username: str, password: str = "pw") -> None:
    """Log in in the browser; give the second factor if asked (enrolling first if the page says so)."""
    page.goto(f"{base}{LOGIN}")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page).not_to_have_url(re.compile(re.escape(LOGIN)))
    path = page.url[len(base) :]
    if path.startswith(ENROLL_PAGE):
        key = key_of(page.locator("#totp-secret").inner_text())
        page.get_by_label("Code from your authenticator app").fill(totp_code(key))
        page.get_by_role("button", name="Confirm").click()
        page.get_by_role("link", name="Continue").click()
    elif path.startswith(CODE_PAGE):
        user = get_user_model().objects.get(username=username)
        page.get_by_label("Code from your authenticator app").fill(code_for(device_for(user)))
        page.get_by_role("button", name="Verify").click()
    expect(page).not_to_have_url(re.compile(r"/accounts/"))
