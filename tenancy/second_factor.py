"""The second factor of the people who move money: approvers and admins give a TOTP code after
their password (django-otp), or one of their one-time recovery codes.

- Who: anyone holding the approver or admin role in any tenant, and superusers
  (``requires_second_factor``). Operators, auditors and integrators are not asked.
- When: a signed-in session of such a person opens nothing but the second-factor pages (and
  logout) until it has given a code (``SecondFactorMiddleware``, the one place that refuses): a
  console page redirects to the code page, an API call made with the session answers 403, a
  live refresh reloads. API tokens are not sessions and are not asked (README).
- First time: enrollment (``enrollment_device``, ``enroll``) shows a new secret; a code from it
  confirms the device, and ten recovery codes are issued and shown once. Each works once.
- Refusals: a wrong code is recorded (``second_factor_failed``) and counts toward django-axes's
  lockout of the username and address (the session ends when it locks); each device also waits
  1, 2, 4... seconds after consecutive wrong codes (django-otp's throttle, in the database).

Every outcome is written to the access log. Views are in ``console.second_factor``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from axes.handlers.proxy import AxesProxyHandler
from django.contrib.auth import logout
from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import Resolver404, resolve, reverse
from django_otp import DEVICE_ID_SESSION_KEY
from django_otp import login as otp_login
from django_otp.models import Device
from django_otp.plugins.otp_static.models import StaticDevice, StaticToken
from django_otp.plugins.otp_totp.models import TOTPDevice

from tenancy.models import AccessEvent, Role
from tenancy.selectors import tenant_ids_for
from tenancy.services import record_access

ROLES = (Role.APPROVER, Role.ADMIN)
RECOVERY_CODES = 10  # issued at enrollment; 40 random bits each (django-otp's StaticToken)
TOTP_NAME = "authenticator"
RECOVERY_NAME = "recovery codes"
# The pages a session may open before its second factor (URL names, no namespace).
OPEN_BEFORE = frozenset({"login", "logout", "second-factor", "second-factor-enroll"})

Kind = AccessEvent.Kind


def requires_second_factor(user: Any) -> bool:
    """Whether ``user`` must give a second factor: approver or admin anywhere, or a superuser."""
    if not user.is_authenticated:
        return False
    return bool(user.is_superuser or tenant_ids_for(user, ROLES))


def session_device(request: HttpRequest) -> Device | None:
    """The confirmed device of ``request.user`` this session gave a code from, if any.

    Read from the session as django-otp's OTPMiddleware does, but only for those who need it
    (one query for them, none for operators): a device deleted or unconfirmed since no longer counts.
    """
    persistent_id = request.session.get(DEVICE_ID_SESSION_KEY)
    device = Device.from_persistent_id(persistent_id) if persistent_id else None
    if device is None or device.user_id != request.user.pk or not device.confirmed:
        return None
    return device


def confirmed_totp(user: Any) -> TOTPDevice | None:
    return TOTPDevice.objects.filter(user_id=user.pk, confirmed=True).order_by("id").first()


def enrollment_device(user: Any) -> TOTPDevice:
    """The unconfirmed TOTP device ``user`` is enrolling with: the same one until it is confirmed,
    so reloading the page does not change the secret already typed into an app."""
    device = TOTPDevice.objects.filter(user_id=user.pk, confirmed=False).order_by("id").first()
    return device or TOTPDevice.objects.create(user=user, name=TOTP_NAME, confirmed=False)


@dataclass(frozen=True)
class Outcome:
    """What became of a code: ``passed`` or not, ``message`` for the person when not,
    ``locked_out`` when this failure locked the username and address (the session has ended)."""

    passed: bool
    message: str = ""
    locked_out: bool = False


def _credentials(user: Any) -> dict[str, str]:
    return {"username": user.get_username()}


def _locked(request: HttpRequest, user: Any) -> Outcome | None:
    """While the username and address are locked out no code is tried: the session ends."""
    credentials = _credentials(user)
    if not AxesProxyHandler.is_locked(request, credentials):
        return None
    logout(request)
    # AxesMiddleware's flags: it answers with the lockout page, naming the account.
    request.axes_locked_out = True  # type: ignore[attr-defined]
    request.axes_credentials = credentials  # type: ignore[attr-defined]
    return Outcome(False, "Too many failed attempts.", locked_out=True)


def _refuse(request: HttpRequest, user: Any, *, detail: str, message: str) -> Outcome:
    """Record a refused code and count it toward the lockout; end the session if it locked."""
    record_access(Kind.SECOND_FACTOR_FAILED, user=user, request=request, detail=detail)
    # Counted like a wrong password (django-axes), without sending user_login_failed: that signal
    # means a wrong password, and the access log would record one.
    AxesProxyHandler.user_login_failed(sender=__name__, credentials=_credentials(user), request=request)
    if getattr(request, "axes_locked_out", False):
        logout(request)  # AxesMiddleware answers with the lockout page
        return Outcome(False, "Too many wrong codes.", locked_out=True)
    return Outcome(False, message)


def _passed(request: HttpRequest, device: Device) -> None:
    otp_login(request, device)
    # A new session key once the session holds more authority, as Django does at login.
    request.session.cycle_key()


def _wait_message(device: Any) -> str:
    allowed, data = device.verify_is_allowed()
    if allowed or not data or "locked_until" not in data:
        return ""
    return f"Too many wrong codes: try again after {data['locked_until']:%H:%M:%S} UTC."


def _normal(code: str) -> str:
    return "".join(code.split()).replace("-", "").lower()


def verify(request: HttpRequest, code: str) -> Outcome:
    """Check ``code`` for ``request.user``: six digits from the authenticator app, or a recovery code.

    Refused (recorded as ``second_factor_failed``, counted toward the lockout): a wrong, reused or
    used-up code, or any code while the device waits after wrong ones, or while locked out.
    A recovery code is deleted as it is accepted (``recovery_code_used``, with how many remain).
    """
    user = request.user
    if locked := _locked(request, user):
        return locked
    code = _normal(code)
    recovery = not code.isdigit()
    model: type[TOTPDevice] | type[StaticDevice] = StaticDevice if recovery else TOTPDevice
    kind = "recovery" if recovery else "totp"
    with transaction.atomic():
        # Locked: two requests with one code (a recovery code, or a TOTP step) cannot both pass.
        devices = list(model.objects.select_for_update().filter(user_id=user.pk, confirmed=True))
        # Read before trying: a device still waiting after earlier wrong codes takes none.
        waiting = next((m for m in map(_wait_message, devices) if m), "")
        device = None if waiting else next((d for d in devices if code and d.verify_token(code)), None)
    if device is None:
        return _refuse(
            request,
            user,
            detail=f"device={kind}" + (" throttled" if waiting else ""),
            message=waiting or "That code is not right. Codes change every 30 seconds; try the current one.",
        )
    _passed(request, device)
    if recovery:
        remaining = StaticToken.objects.filter(device_id=device.pk).count()
        record_access(Kind.RECOVERY_CODE_USED, user=user, request=request, detail=f"remaining={remaining}")
    else:
        record_access(Kind.SECOND_FACTOR_PASSED, user=user, request=request, detail="device=totp")
    return Outcome(True)


def enroll(request: HttpRequest, device: TOTPDevice, code: str) -> tuple[Outcome, list[str]]:
    """Confirm ``device`` (``request.user``'s, unconfirmed) with a ``code`` from it; on success the
    session counts as verified and ten new recovery codes replace any earlier ones.

    Returns the outcome and the recovery codes (to show once; only their rows are kept).
    Refused like ``verify``: a wrong code, the device waiting, a locked-out account.
    """
    user = request.user
    if locked := _locked(request, user):
        return locked, []
    with transaction.atomic():
        device = TOTPDevice.objects.select_for_update().get(pk=device.pk, user_id=user.pk)
        waiting = _wait_message(device)  # before trying, as in ``verify``
        if waiting or device.confirmed or not device.verify_token(_normal(code)):
            passed = False
        else:
            passed = True
            device.confirmed = True
            device.save(update_fields=["confirmed"])
            codes = _issue_recovery_codes(user)
    if not passed:
        return _refuse(
            request,
            user,
            detail="device=totp enrollment" + (" throttled" if waiting else ""),
            message=waiting or "That code is not right: type the six digits the app shows now.",
        ), []
    _passed(request, device)
    record_access(
        Kind.SECOND_FACTOR_ENROLLED, user=user, request=request, detail=f"recovery_codes={len(codes)}"
    )
    return Outcome(True), codes


def _issue_recovery_codes(user: Any) -> list[str]:
    StaticDevice.objects.filter(user_id=user.pk).delete()
    device = StaticDevice.objects.create(user=user, name=RECOVERY_NAME, confirmed=True)
    codes = [StaticToken.random_token() for _ in range(RECOVERY_CODES)]
    StaticToken.objects.bulk_create(StaticToken(device=device, token=code) for code in codes)
    return codes


# --- the one place an unverified session is refused ------------------------------------------------


def _is_open(request: HttpRequest) -> bool:
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return False
    return not match.namespace and match.url_name in OPEN_BEFORE


def _refusal(request: HttpRequest) -> HttpResponse:
    if request.path_info.startswith("/api/"):
        return JsonResponse(
            {"detail": "This session has not given its second factor: finish signing in in the console."},
            status=403,
        )
    if request.headers.get("HX-Request") == "true":
        # htmx would swap the code page into a fragment: reload the page instead, which lands there.
        return HttpResponse(status=204, headers={"HX-Refresh": "true"})
    # Nothing is acted on; a GET comes back here after the code, a POST starts again from its page.
    target = reverse("second-factor")
    if request.method == "GET":
        target += "?" + urlencode({"next": request.get_full_path()})
    return HttpResponseRedirect(target)


class SecondFactorMiddleware:
    """Refuse every page and call but the second-factor pages to a session that needs a code and
    has not given one (after AuthenticationMiddleware; a token's API calls carry no session)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if requires_second_factor(request.user) and session_device(request) is None and not _is_open(request):
            return _refusal(request)
        return self.get_response(request)
