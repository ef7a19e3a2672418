"""The alerts page (``/console/alerts/``): tasks with no valid next event coming, and what people did.

Operators, admins and auditors of a tenant read its alerts (``runtime.alerts.READ_ROLES``;
the JSON twin is ``GET /api/alerts/``); operators and admins acknowledge them with a note
or snooze them, each a confirmed form posting to its own URL and recorded as an
append-only ``AlertNote``. The navigation's badge (``templatetags/alerts_badge.py``)
counts what needs attention: open, unacknowledged, not snoozed.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST, require_safe

from console.access import tenant_ids_or_403
from console.forms import ConsoleForm
from console.posting import Done, Refusal, form_post
from runtime import alerts
from runtime.models import Alert, AlertKind
from tenancy.selectors import tenant_ids_for

PAGE = 50
YES_NO_ANY = [("", "any"), ("true", "yes"), ("false", "no")]
SNOOZE_FOR = {
    "1h": timedelta(hours=1),
    "4h": timedelta(hours=4),
    "1d": timedelta(days=1),
    "3d": timedelta(days=3),
}
SNOOZE_LABELS = [("1h", "1 hour"), ("4h", "4 hours"), ("1d", "1 day"), ("3d", "3 days")]


class AlertFilterForm(ConsoleForm):
    status = forms.ChoiceField(
        required=False,
        choices=[
            ("", "open"),
            ("attention", "needs attention"),
            ("cleared", "cleared"),
            ("any", "any"),
        ],
    )
    acknowledged = forms.ChoiceField(required=False, choices=YES_NO_ANY)
    kind = forms.ChoiceField(required=False, choices=[("", "any"), *AlertKind.choices])
    task = forms.UUIDField(required=False, label="Task id")
    before = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)


class _Confirmed(ConsoleForm):
    confirm = forms.BooleanField(
        error_messages={"required": "Tick the confirmation box: nothing was recorded."}
    )
    # Where to come back to: this page with its filters (checked in ``_back``).
    next = forms.CharField(required=False, max_length=1000, widget=forms.HiddenInput)

    def problem(self) -> str:
        return " ".join(str(error) for errors in self.errors.values() for error in errors)


class AcknowledgeForm(_Confirmed):
    note = forms.CharField(
        max_length=alerts.NOTE_MAX,
        widget=forms.Textarea(attrs={"rows": 2}),
        label="What you are doing about it",
    )


class SnoozeForm(_Confirmed):
    duration = forms.ChoiceField(choices=SNOOZE_LABELS, label="Snooze for")
    note = forms.CharField(required=False, max_length=alerts.NOTE_MAX, label="Note (optional)")


def _yes_no(value: str) -> bool | None:
    return {"true": True, "false": False}.get(value)


@require_safe
@login_required
def alert_list(request: HttpRequest) -> HttpResponse:
    tenant_ids_or_403(request.user, alerts.READ_ROLES)
    form = AlertFilterForm(request.GET)
    page, now = None, timezone.now()
    if form.is_valid():
        given = form.cleaned_data
        status = given["status"]
        found = alerts.filter_alerts(
            alerts.visible_alerts(request.user),
            now=now,
            is_open={"cleared": False, "any": None}.get(status, True),
            attention=status == "attention",
            acknowledged=_yes_no(given["acknowledged"]),
            kind=given["kind"],
            task=given["task"],
        )
        page = alerts.alerts_page(found, before=given["before"], limit=PAGE)
    query = request.GET.copy()
    query.pop("before", None)
    attention = alerts.attention_count(request.user, now=now)
    context = {
        "form": form,
        "page": page,
        "query": query.urlencode(),
        "here": request.get_full_path(),
        "now": now,
        "attention": min(attention, alerts.BADGE_CAP),
        "attention_more": attention > alerts.BADGE_CAP,
        "handles": set(tenant_ids_for(request.user, alerts.HANDLE_ROLES)),
        "acknowledge_form": AcknowledgeForm(),
        "snooze_form": SnoozeForm(),
        "tz": timezone.get_current_timezone_name(),
    }
    return render(request, "console/alerts.html", context, status=200 if page else 400)


def _handled(request: HttpRequest, alert_id: int) -> Alert:
    """The alert (404 outside the user's tenants) if the user may act on it (403 otherwise)."""
    alert = alerts.get_alert(request.user, alert_id)
    if not alerts.may_handle(request.user, alert):
        raise PermissionDenied
    return alert


def _back(form: forms.Form) -> str:
    wanted = str(form.data.get("next", ""))
    page = reverse("console:alerts")
    return wanted if wanted.startswith(page) and "//" not in wanted else page


NOT_RECORDED = Refusal(alerts.AlertRefused, lambda exc: f"Nothing recorded: {exc}")


@login_required
@require_POST
def alert_acknowledge(request: HttpRequest, alert_id: int) -> HttpResponse:
    alert = _handled(request, alert_id)

    def acknowledge(data: dict[str, Any]) -> Done:
        _, first = alerts.acknowledge(alert, user=request.user, note=data["note"])
        if first:
            return Done(f"Alert #{alert.id} acknowledged.")
        return Done(f"Your note is recorded; alert #{alert.id} was already acknowledged by someone else.")

    form = AcknowledgeForm(request.POST)
    return form_post(request, form, acknowledge, back=_back(form), refusals=(NOT_RECORDED,))


@login_required
@require_POST
def alert_snooze(request: HttpRequest, alert_id: int) -> HttpResponse:
    alert = _handled(request, alert_id)

    def snooze(data: dict[str, Any]) -> Done:
        until = timezone.now() + SNOOZE_FOR[data["duration"]]
        alerts.snooze(alert, user=request.user, until=until, note=data["note"])
        return Done(f"Alert #{alert.id} snoozed until {timezone.localtime(until):%Y-%m-%d %H:%M %Z}.")

    form = SnoozeForm(request.POST)
    return form_post(request, form, snooze, back=_back(form), refusals=(NOT_RECORDED,))
