"""The second-factor pages after the password: the code page and enrollment.

Thin views over ``tenancy.second_factor`` (which decides, records and refuses). Both pages are
the only ones a session of an approver or admin opens before its code
(``SecondFactorMiddleware``); anyone who needs no code, or has given it, is sent on.
"""

from __future__ import annotations

from base64 import b32encode

import segno
from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render, resolve_url
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_http_methods

from console.forms import ConsoleForm
from console.views import asked_for
from tenancy import second_factor
from tenancy.second_factor import Outcome


class CodeForm(ConsoleForm):
    # Six digits, or a recovery code (eight letters and digits, spaces and dashes ignored).
    code = forms.CharField(
        max_length=32,
        strip=True,
        widget=forms.TextInput(
            attrs={"autocomplete": "one-time-code", "autofocus": True, "spellcheck": "false"}
        ),
    )


def _next(request: HttpRequest) -> str:
    """Where to go after the code: ``next`` if it is a page of this site, else the landing page."""
    wanted = asked_for(request.POST.get("next") or request.GET.get("next") or "")
    if wanted and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return wanted
    return resolve_url(settings.LOGIN_REDIRECT_URL)


def _done(request: HttpRequest) -> bool:
    """Nothing to ask: the person needs no second factor, or this session has given it."""
    return not second_factor.requires_second_factor(request.user) or (
        second_factor.session_device(request) is not None
    )


def _with_next(name: str, next_url: str) -> str:
    return f"{reverse(name)}?{urlencode({'next': next_url})}"


def _refused(outcome: Outcome, form: CodeForm) -> HttpResponse | None:
    if outcome.locked_out:
        return HttpResponse(status=429)  # replaced by the lockout page (AxesMiddleware)
    form.add_error("code", outcome.message)
    return None


@login_required
@require_http_methods(["GET", "POST"])
def code(request: HttpRequest) -> HttpResponse:
    """Ask for the code from the authenticator app (or a recovery code); then on to ``next``."""
    next_url = _next(request)
    if _done(request):
        return HttpResponseRedirect(next_url)
    if second_factor.confirmed_totp(request.user) is None:
        return HttpResponseRedirect(_with_next("second-factor-enroll", next_url))
    form = CodeForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        outcome = second_factor.verify(request, form.cleaned_data["code"])
        if outcome.passed:
            return HttpResponseRedirect(next_url)
        if (locked := _refused(outcome, form)) is not None:
            return locked
    status = 400 if form.errors else 200
    return render(request, "registration/second_factor.html", {"form": form, "next": next_url}, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def enroll(request: HttpRequest) -> HttpResponse:
    """Set up the authenticator app: the secret (text, otpauth URI, QR code), confirmed with a code;
    then the recovery codes, shown this once."""
    next_url = _next(request)
    if _done(request):
        return HttpResponseRedirect(next_url)
    if second_factor.confirmed_totp(request.user) is not None:
        return HttpResponseRedirect(_with_next("second-factor", next_url))
    device = second_factor.enrollment_device(request.user)
    form = CodeForm(request.POST if request.method == "POST" else None)
    if form.is_valid():
        outcome, codes = second_factor.enroll(request, device, form.cleaned_data["code"])
        if outcome.passed:
            return render(request, "registration/recovery_codes.html", {"codes": codes, "next": next_url})
        if (locked := _refused(outcome, form)) is not None:
            return locked
    secret = b32encode(device.bin_key).decode()
    uri = device.config_url
    context = {
        "form": form,
        "next": next_url,
        "secret": " ".join(secret[i : i + 4] for i in range(0, len(secret), 4)),
        "uri": uri,
        # Inline SVG (no script, no style attribute: the CSP holds); dark on light in either theme.
        "qr": segno.make(uri, error="m").svg_inline(
            scale=4, dark="#000", light="#fff", title="QR code of the secret"
        ),
    }
    status = 400 if form.errors else 200
    return render(request, "registration/second_factor_enroll.html", context, status=status)
