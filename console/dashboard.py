"""The dashboard: how the work of the user's tenants stands, at a glance, refreshed live.

Every console role reads it, scoped to the tenants where the user holds a
role (another tenant's numbers never appear). The counts and age buckets come
from the maintained reading the beat stores every ``ROLLUP_INTERVAL`` seconds
(``runtime.rollups``: the same reading as ``/metrics``, ``runtime.gauges``,
narrowed here to the user's tenants), one row read: a request never reads the
tasks table whole, even the first after a start; before the first recount the
page says so. The
oldest waits and the unknown outcomes are read per request (a few index
ranges); the transition rate and approval latency are cached per set of
tenants. Charts are inline SVG (``console.charts``); the live refresh swaps
``#dashboard-live`` every 5 s like the queue (``static/console/live.js``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_safe

from console import charts
from reads.usage import usage_by_type
from runtime import gauges, rollups
from tasks.states import TERMINAL, State
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for

OLDEST = 10  # rows in "oldest waits" and "unknown outcomes"
# Who may open the alerts page the count links to (the same roles as runtime.alerts.READ_ROLES).
ALERT_READERS = (Role.OPERATOR, Role.ADMIN, Role.AUDITOR)
BUCKET_LABELS = tuple(f"≤{label}" for label in ("1m", "5m", "15m", "1h", "4h", "1d", "3d", "7d")) + (">7d",)


def duration(seconds: float | None) -> str:
    """A short human duration: "45 s", "12 min", "3.5 h", "2.1 d"."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


@dataclass(frozen=True)
class AgeChart:
    state: str
    label: str
    total: int
    columns: tuple[charts.Column, ...]


def _task_charts(snapshot: gauges.Snapshot) -> dict[str, Any]:
    by_state: dict[str, dict[str, int]] = {}
    for row in snapshot.tasks:
        types = by_state.setdefault(row.state, {})
        types[row.task_type] = types.get(row.task_type, 0) + row.n
    series = sorted({task_type for types in by_state.values() for task_type in types})
    rows = [(value, label, by_state[value]) for value, label in State.choices if value in by_state]
    bars = charts.stacked_bars(rows, series)
    return {
        "bars": bars,
        "series": [(name, charts.series_class(index)) for index, name in enumerate(series)],
        "table": [(bar, [by_state[bar.key].get(name, 0) for name in series]) for bar in bars],
    }


def _age_charts(snapshot: gauges.Snapshot) -> list[AgeChart]:
    labels = dict(State.choices)
    per_state = {}
    for state in gauges.WAITING_STATES:
        rows = [row for row in snapshot.waits if row.state == state]
        per_state[state] = [sum(row.counts[i] for row in rows) for i in range(len(BUCKET_LABELS))]
    scale = max((max(counts) for counts in per_state.values()), default=0)
    return [
        AgeChart(state, labels[state], sum(counts), charts.columns(counts, BUCKET_LABELS, scale=scale))
        for state, counts in per_state.items()
    ]


def _alerts_link(user: Any) -> str:
    if not tenant_ids_for(user, ALERT_READERS):
        return ""
    try:
        return reverse("console:alerts")
    except NoReverseMatch:  # a deployment without the alerts page
        return ""


def build(user: Any, tenant_ids: Sequence[int]) -> dict[str, Any]:
    """Everything the page shows for ``tenant_ids``."""
    now = timezone.now()
    stored = rollups.gauges_reading()
    snapshot = (stored or gauges.Snapshot(now, 0.0, (), (), (), (), None)).for_tenants(tenant_ids)
    trend = gauges.trend(tenant_ids)
    unknown = gauges.unknown_outcomes(tenant_ids, limit=OLDEST)
    oldest_unknown = min((since for _, _, since in snapshot.unknown), default=None)
    live = sum(row.n for row in snapshot.tasks if row.state not in TERMINAL)
    return {
        "now": now,
        "read_at": snapshot.read_at,
        "not_read_yet": stored is None,
        "bucket_labels": BUCKET_LABELS,
        "refresh_every": settings.CELERY_BEAT_SCHEDULE["rollups"]["schedule"],
        "live": live,
        "waiting": sum(sum(row.counts) for row in snapshot.waits),
        "tasks": _task_charts(snapshot),
        "ages": _age_charts(snapshot),
        "oldest": [
            (task, duration((now - task.state_entered_at).total_seconds()))
            for task in gauges.oldest_waits(tenant_ids, limit=OLDEST)
        ],  # fmt: skip
        "unknown": [
            (action, duration((now - (action.unknown_since or action.updated_at)).total_seconds()))
            for action in unknown
        ],
        "unknown_total": sum(n for _, n, _ in snapshot.unknown),
        "unknown_oldest": None
        if oldest_unknown is None
        else duration((now - oldest_unknown).total_seconds()),
        "alerts": None if snapshot.alerts is None else sum(n for _, _, n in snapshot.alerts),
        "alerts_link": _alerts_link(user),
        "usage": usage_by_type(tenant_ids),
        "trend": charts.sparkline(trend.per_minute),
        "trend_hours": gauges.TREND_HOURS,
        "last_hour": sum(trend.per_minute[-60:]),
        "latency": {
            "decided": trend.decided,
            "median": duration(trend.median_seconds),
            "p90": duration(trend.p90_seconds),
            "hours": gauges.LATENCY_HOURS,
        },
    }


@require_safe
@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    context = build(request.user, tenant_ids_for(request.user))
    # The live refresh asks for the changing part only (the same template's block, without the layout).
    template = "console/dashboard_live.html" if getattr(request, "htmx", False) else "console/dashboard.html"
    response = render(request, template, context)
    patch_vary_headers(response, ["HX-Request"])
    return response
