"""The access log page (``/console/access/``) and the console's 403 answer.

Auditors and admins read who logged in, failed to, was locked out or refused,
and which roles and tokens were granted or revoked, in their tenants
(``tenancy.selectors.visible_access_events``; its JSON twin is
``GET /api/access-events/``). Every 403 the console gives is recorded there too:
``forbidden`` is the project's ``handler403``.
"""

from __future__ import annotations

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views import defaults
from django.views.decorators.http import require_safe

from console.access import tenant_ids_or_403
from console.forms import ConsoleForm
from tenancy.models import AccessEvent
from tenancy.selectors import (
    ACCESS_LOG_ROLES,
    access_events_page,
    filter_access_events,
    visible_access_events,
)
from tenancy.services import record_access

PAGE = 50


class AccessFilterForm(ConsoleForm):
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *AccessEvent.Kind.choices])
    user = forms.CharField(required=False, max_length=150, help_text="username, exactly")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


@require_safe
@login_required
def access_events(request: HttpRequest) -> HttpResponse:
    tenant_ids_or_403(request.user, ACCESS_LOG_ROLES)
    form = AccessFilterForm(request.GET)
    page = None
    if form.is_valid():
        events = filter_access_events(
            visible_access_events(request.user),
            kind=form.cleaned_data["kind"],
            username=form.cleaned_data["user"].strip(),
        )
        page = access_events_page(events, before=form.cleaned_data["before"], limit=PAGE)
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "tz": timezone.get_current_timezone_name(),
    }
    return render(request, "console/access_log.html", context, status=200 if page else 400)


def forbidden(request: HttpRequest, exception: Exception) -> HttpResponse:
    """``handler403``: record the refusal, then answer with the usual 403 page."""
    record_access(
        AccessEvent.Kind.FORBIDDEN,
        user=getattr(request, "user", None),
        request=request,
        detail=f"{request.method} {exception}".strip(),
    )
    return defaults.permission_denied(request, exception)
