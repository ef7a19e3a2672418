"""Two rules for signed-in people, applied to every response (settings.MIDDLEWARE).

- ``SessionTimeoutMiddleware``: a console session ends after ``SESSION_IDLE_TIMEOUT`` seconds
  without a request of the person's own, and ``SESSION_ABSOLUTE_TIMEOUT`` seconds after sign-in
  whatever happens. The live refresh polls every few seconds while a tab is visible; a poll is not
  the person doing something, so it neither keeps the session alive nor escapes the limits (an
  expired poll reloads the page, which lands on the login form). Both clocks start at sign-in
  (``stamp_sign_in``, a ``user_logged_in`` receiver connected by ``console.apps``).
- ``NoStoreForUsersMiddleware``: a page or API answer given to a signed-in caller holds tenant data;
  ``Cache-Control: no-store`` keeps it out of the browser's and any proxy's cache (static files are
  answered by WhiteNoise before this runs, and stay cacheable).

Both sit after authentication and messages, and are outside the layers: they know only Django.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import SESSION_KEY, logout
from django.contrib.sessions.backends.base import SessionBase
from django.http import HttpRequest, HttpResponse
from django.utils.cache import add_never_cache_headers

SIGNED_IN_AT = "session:signed_in_at"  # when this session signed in (seconds since the epoch)
ACTIVE_AT = "session:active_at"  # the person's last own request, refreshed at most once a minute
ACTIVE_GRANULARITY = 60.0  # seconds (at most a tenth of the idle limit) ACTIVE_AT may lag, to write rarely


def is_background_poll(request: HttpRequest) -> bool:
    """An htmx GET: in this console, only the live refresh makes them, never a person's click."""
    return request.method == "GET" and request.headers.get("HX-Request") == "true"


def stamp_sign_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    """At sign-in (``django.contrib.auth.login``), start both clocks in the new session."""
    if request is not None and hasattr(request, "session"):
        request.session[SIGNED_IN_AT] = request.session[ACTIVE_AT] = time.time()


def session_expiry(session: SessionBase, now: float) -> str:
    """Why a signed-in session has ended ("idle", "absolute"), or "" while it is still good."""
    signed_in = session[SIGNED_IN_AT]
    active = session.get(ACTIVE_AT, signed_in)
    if now - signed_in > settings.SESSION_ABSOLUTE_TIMEOUT:
        return "absolute"
    if now - active > settings.SESSION_IDLE_TIMEOUT:
        return "idle"
    return ""


class SessionTimeoutMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        session = request.session
        now = time.time()
        # Only sessions that carry a sign-in: a token-authenticated API call has no session to limit.
        if SESSION_KEY in session:
            if SIGNED_IN_AT not in session:  # signed in before these limits existed: they count from now
                session[SIGNED_IN_AT] = session[ACTIVE_AT] = now
            ended = session_expiry(session, now)
            if ended:
                logout(request)
                minutes = round(settings.SESSION_IDLE_TIMEOUT / 60)
                messages.info(
                    request,
                    f"You were signed out after {minutes} minutes without activity."
                    if ended == "idle"
                    else "You were signed out: sessions last at most "
                    f"{round(settings.SESSION_ABSOLUTE_TIMEOUT / 3600)} hours. Sign in again.",
                )
            elif not is_background_poll(request) and now - session.get(ACTIVE_AT, 0) >= _granularity():
                session[ACTIVE_AT] = now
        response = self.get_response(request)
        if is_background_poll(request) and _sent_to_login(response):
            # htmx would follow the redirect and swap the login form into the rows: reload instead.
            response = HttpResponse(status=204, headers={"HX-Refresh": "true"})
        return response


def _granularity() -> float:
    idle_limit: int = settings.SESSION_IDLE_TIMEOUT
    return min(ACTIVE_GRANULARITY, idle_limit / 10)


def _sent_to_login(response: HttpResponse) -> bool:
    location = response.get("Location", "") if response.status_code in (301, 302, 303) else ""
    return location.startswith(str(settings.LOGIN_URL))


class NoStoreForUsersMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        # Read after the view: API views authenticate tokens themselves (DRF sets request.user).
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            add_never_cache_headers(response)
        return response
