"""Authentication events into the access log.

Django announces logins, failed logins and logouts with signals, and django-axes
announces a lockout the same way; these are the only places those happen, so the
access log listens here rather than in every login path. Recording only: nothing
here decides anything.
"""

from __future__ import annotations

from typing import Any

from axes.signals import user_locked_out
from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed

from tenancy.models import AccessEvent
from tenancy.services import record_access


def _account(username: str) -> Any:
    """The account a typed name belongs to (None if none does), so its tenants' auditors see the attempt."""
    if not username:
        return None
    user_model = get_user_model()
    return user_model._default_manager.filter(**{user_model.USERNAME_FIELD: username}).first()


def on_login(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    record_access(AccessEvent.Kind.LOGIN, user=user, request=request)


def on_login_failed(sender: Any, credentials: dict[str, Any], request: Any = None, **kwargs: Any) -> None:
    username = str(credentials.get(get_user_model().USERNAME_FIELD) or "")[:150]
    record_access(AccessEvent.Kind.LOGIN_FAILED, user=_account(username), username=username, request=request)


def on_logout(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    if user is not None:  # logging out without a session is no event
        record_access(AccessEvent.Kind.LOGOUT, user=user, request=request)


def on_locked_out(sender: Any, request: Any, username: str | None = None, **kwargs: Any) -> None:
    name = (username or "")[:150]
    failures = getattr(request, "axes_failures_since_start", None)
    detail = f"failures={failures}" if failures is not None else ""
    record_access(
        AccessEvent.Kind.LOCKED_OUT, user=_account(name), username=name, request=request, detail=detail
    )


def connect() -> None:
    # dispatch_uid: connecting twice (tests reloading apps) must not record every event twice.
    user_logged_in.connect(on_login, dispatch_uid="tenancy.access.login")
    user_login_failed.connect(on_login_failed, dispatch_uid="tenancy.access.login_failed")
    user_logged_out.connect(on_logout, dispatch_uid="tenancy.access.logout")
    user_locked_out.connect(on_locked_out, dispatch_uid="tenancy.access.locked_out")
