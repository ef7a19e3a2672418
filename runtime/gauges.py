"""What the database says about the work right now: the readings behind ``/metrics`` and the dashboard.

Counters recorded in one process (``tasks.metrics``) cannot say how many tasks
wait, or for how long: only the database knows that, across every worker. So
these are read from it, at scrape (or page) time, and shared:

- ``snapshot()``: every tenant's tasks per state and task type (quarantined ones
  per reason too), the ages of waiting tasks in histogram buckets, the effects
  whose outcome is unknown, open alerts, and per region the oldest runnable
  task no worker holds (how far the doorbell and the sweep lag behind). A few
  GROUP BY statements, cost proportional to the table (a grouped count cannot be
  less), so the result is kept in the cache for ``METRICS_CACHE_SECONDS`` and
  read again by one caller at a time: many scrapers, web processes and
  dashboards cost one reading per period. Ages are stored as instants, so an
  age reported from a cached snapshot is still an age now.
- the dashboard's tenant-scoped reads (oldest waits, unknown outcomes, the
  transition rate, approval latency), each an index range whatever the size
  of the table, the two aggregated ones cached per set of tenants.

Portable SQL (the ORM's own): the SQLite demo shows the same dashboard. The
age buckets are a ``CASE`` per row rather than PostgreSQL's ``width_bucket``
for that reason; the cost is the same.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.db.models import Case, Count, DateTimeField, F, IntegerField, Min, Q, Sum, Value, When
from django.db.models.functions import Coalesce, TruncMinute
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent
from config import metrics
from ledger.models import Action, DispatchState
from tasks.leases import live_lease_exists
from tasks.models import Task
from tasks.states import RUNNABLE, WAITING, State
from tenancy.models import Tenant

WAITING_STATES = tuple(sorted(WAITING))
# Upper bounds, in seconds, of the age-in-state buckets of waiting tasks (a last one holds the rest):
# a minute, 5 and 15 minutes, an hour, 4 hours, a day, 3 days, a week.
AGE_BUCKETS = (60, 300, 900, 3600, 14400, 86400, 259200, 604800)
# The database refuses a reading that takes longer: a scrape or a page answers without it.
STATEMENT_TIMEOUT_MS = 5000
TREND_HOURS = 6  # the transition rate: per minute, over this many hours
LATENCY_HOURS = 24  # approval latency: requests decided in this many hours
_KEY, _LOCK = "durable:gauges", "durable:gauges:reading"


@dataclass(frozen=True)
class TaskCount:
    tenant_id: int
    state: str
    task_type: str
    reason: str  # the state reason of quarantined tasks; "" for every other state
    region: str  # the region of runnable tasks; "" for every other state
    n: int


@dataclass(frozen=True)
class WaitAges:
    """Waiting tasks of one tenant in one state: how many per age bucket, and their ages added up."""

    tenant_id: int
    state: str
    counts: tuple[int, ...]  # per bucket of AGE_BUCKETS, then the rest (not cumulative)
    total_seconds: float


@dataclass(frozen=True)
class Snapshot:
    read_at: datetime
    took: float  # seconds the reading took
    tasks: tuple[TaskCount, ...]
    waits: tuple[WaitAges, ...]
    unknown: tuple[tuple[int, int, datetime], ...]  # (tenant id, effects in doubt, the oldest one since)
    unleased: tuple[tuple[str, datetime], ...]  # (region, when its oldest runnable unleased task got there)
    alerts: tuple[tuple[int, str, int], ...] | None  # (tenant id, kind, open); None: no alert table here

    def for_tenants(self, tenant_ids: Iterable[int]) -> Snapshot:
        """The same reading, narrowed to ``tenant_ids`` (regions are not a tenant's: left out)."""
        ids = frozenset(tenant_ids)
        return replace(
            self,
            tasks=tuple(row for row in self.tasks if row.tenant_id in ids),
            waits=tuple(row for row in self.waits if row.tenant_id in ids),
            unknown=tuple(row for row in self.unknown if row[0] in ids),
            unleased=(),
            alerts=None if self.alerts is None else tuple(row for row in self.alerts if row[0] in ids),
        )


def snapshot() -> Snapshot:
    """The latest reading, at most ``METRICS_CACHE_SECONDS`` old (0: always read now).

    An expired reading is replaced by whoever asks first; callers arriving
    while that reading runs get the previous one rather than a second reading.
    """
    period = float(settings.METRICS_CACHE_SECONDS)
    held: Snapshot | None = cache.get(_KEY)
    if held is not None and (timezone.now() - held.read_at).total_seconds() < period:
        return held
    # Only an expired reading is worth a lock: without any, every caller must wait for one anyway.
    locked = held is not None and period > 0
    if held is not None and locked and not cache.add(_LOCK, True, timeout=max(period, 5)):
        return held
    try:
        fresh = read()
        # Kept past its period, so that it can be served while the next reading runs.
        cache.set(_KEY, fresh, timeout=max(period * 10, 60))
    finally:
        if locked:
            cache.delete(_LOCK)
    return fresh


def read(now: datetime | None = None) -> Snapshot:
    started = time.perf_counter()
    now = now or timezone.now()
    with transaction.atomic():
        _limit_statements()
        tasks = _task_counts()
        waits = _wait_ages(now)
        unknown = tuple(
            (row["task__tenant_id"], row["n"], row["oldest"])
            for row in Action.objects.filter(dispatch_state=DispatchState.UNKNOWN)
            .values("task__tenant_id")
            .annotate(n=Count("pk"), oldest=Min(Coalesce("unknown_since", "updated_at")))
            .order_by()
        )
        regions = sorted({row.region for row in tasks if row.region})
        unleased = tuple(
            (region, entered) for region in regions if (entered := _oldest_unleased(region, now)) is not None
        )
        alerts = _open_alerts()
    return Snapshot(now, time.perf_counter() - started, tasks, waits, unknown, unleased, alerts)


def _limit_statements() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL statement_timeout = {int(STATEMENT_TIMEOUT_MS)}")


def _task_counts() -> tuple[TaskCount, ...]:
    """One GROUP BY over the tasks: per tenant, state and type (quarantine reason, runnable region)."""
    rows = (
        Task.objects.annotate(
            reason=Case(When(state=State.QUARANTINED, then=F("state_reason")), default=Value("")),
            lane=Case(When(state__in=sorted(RUNNABLE), then=F("region")), default=Value("")),
        )
        .values("tenant_id", "state", "task_type", "reason", "lane")
        .annotate(n=Count("pk"))
        .order_by()
    )
    return tuple(
        TaskCount(row["tenant_id"], row["state"], row["task_type"], row["reason"], row["lane"], row["n"])
        for row in rows
    )


def age_bucket(now: datetime) -> Case:
    """The bucket index (into AGE_BUCKETS, then one more) of a task's time in its state."""
    whens = [
        When(state_entered_at__gte=now - timedelta(seconds=bound), then=Value(index))
        for index, bound in enumerate(AGE_BUCKETS)
    ]
    return Case(*whens, default=Value(len(AGE_BUCKETS)), output_field=IntegerField())


def _wait_ages(now: datetime) -> tuple[WaitAges, ...]:
    """Waiting tasks per tenant, state and age bucket: the waiting states' rows only.

    Naming every tenant turns "these states" into ranges of ``task_tenant_state_id``
    (tenant, state, …): the cost follows the number of waiting tasks, not the table.
    """
    at = Value(now, output_field=DateTimeField())
    rows = (
        Task.objects.filter(tenant_id__in=Tenant.objects.values("pk"), state__in=WAITING_STATES)
        .annotate(bucket=age_bucket(now))
        .values("tenant_id", "state", "bucket")
        .annotate(n=Count("pk"), waited=Sum(at - F("state_entered_at")))
        .order_by()
    )
    grouped: dict[tuple[int, str], tuple[list[int], list[float]]] = {}
    for row in rows:
        counts, total = grouped.setdefault(
            (row["tenant_id"], row["state"]), ([0] * (len(AGE_BUCKETS) + 1), [0.0])
        )
        counts[row["bucket"]] += row["n"]
        total[0] += row["waited"].total_seconds() if row["waited"] else 0.0
    return tuple(
        WaitAges(tenant_id, state, tuple(counts), total[0])
        for (tenant_id, state), (counts, total) in sorted(grouped.items())
    )


def _oldest_unleased(region: str, now: datetime) -> datetime | None:
    """When the longest-waiting runnable task of ``region`` that no worker holds got there (index
    ``task_runnable``, oldest first, stopping at the first one without a live lease)."""
    entered: datetime | None = (
        Task.objects.filter(state__in=sorted(RUNNABLE), region=region)
        .exclude(live_lease_exists(now))
        .order_by("state_entered_at")
        .values_list("state_entered_at", flat=True)
        .first()
    )
    return entered


def alert_model() -> Any | None:
    """``runtime.Alert`` if this deployment has it (read by name: the readings do without it)."""
    try:
        return apps.get_model("runtime", "Alert")
    except LookupError:
        return None


def alert_kinds() -> tuple[str, ...]:
    """Every kind an alert can be (each a series of ``durable_alerts_open``, 0 when none is open)."""
    model = alert_model()
    if model is None:
        return ()
    return tuple(str(value) for value, _ in model._meta.get_field("kind").choices or ())


def _open_alerts() -> tuple[tuple[int, str, int], ...] | None:
    model = alert_model()
    if model is None:
        return None
    rows = model.objects.filter(cleared_at__isnull=True).values("tenant_id", "kind").annotate(n=Count("pk"))
    return tuple((row["tenant_id"], row["kind"], row["n"]) for row in rows.order_by())


# What /metrics serves its database gauges from (config.metrics, which reads no model itself): handed
# over by runtime.apps at app loading.
READINGS = metrics.Readings(
    snapshot=snapshot, alert_kinds=alert_kinds, waiting_states=WAITING_STATES, age_buckets=AGE_BUCKETS
)


# --- the dashboard's tenant-scoped reads ------------------------------------------------------------


def oldest_waits(tenant_ids: Sequence[int], *, limit: int = 10) -> list[Task]:
    """The ``limit`` tasks of these tenants longest in a waiting state, longest first.

    One query per waiting state, each the oldest ``limit`` rows of that state in
    age order, merged here: no single index orders rows of several states by age.
    """
    found: list[Task] = []
    for state in WAITING_STATES:
        found += (
            Task.objects.filter(tenant_id__in=tenant_ids, state=state)
            .select_related("tenant")
            .only(
                "id", "tenant__slug", "task_type", "state", "state_entered_at", "wait_deadline", "objective"
            )
            .order_by("state_entered_at", "id")[:limit]
        )
    return sorted(found, key=lambda task: (task.state_entered_at, task.id))[:limit]


def unknown_outcomes(tenant_ids: Sequence[int], *, limit: int = 10) -> list[Action]:
    """The effects of these tenants whose outcome is unknown, longest in doubt first (``action_in_doubt``)."""
    return list(
        Action.objects.filter(dispatch_state=DispatchState.UNKNOWN, task__tenant_id__in=tenant_ids)
        .select_related("task")
        .only(
            "id", "idempotency_key", "connector", "unknown_since", "updated_at", "task__id", "task__task_type"
        )
        .annotate(since=Coalesce("unknown_since", "updated_at"))
        .order_by("since", "id")[:limit]
    )


@dataclass(frozen=True)
class Trend:
    """The transition rate and the approvers' latency of some tenants, as of ``read_at``."""

    read_at: datetime
    per_minute: tuple[int, ...]  # transitions in each minute of the last TREND_HOURS, oldest first
    decided: int  # approval requests decided in the last LATENCY_HOURS
    median_seconds: float | None
    p90_seconds: float | None


def trend(tenant_ids: Sequence[int]) -> Trend:
    """``read_trend`` for these tenants, kept for ``METRICS_CACHE_SECONDS`` (per set of tenants)."""
    period = float(settings.METRICS_CACHE_SECONDS)
    key = "durable:trend:" + hashlib.sha256(",".join(map(str, sorted(tenant_ids))).encode()).hexdigest()[:32]
    held: Trend | None = cache.get(key) if period > 0 else None
    if held is not None:
        return held
    fresh = read_trend(tenant_ids)
    if period > 0:
        cache.set(key, fresh, timeout=period)
    return fresh


def read_trend(tenant_ids: Sequence[int], now: datetime | None = None) -> Trend:
    now = now or timezone.now()
    this_minute = now.replace(second=0, microsecond=0)
    minutes = TREND_HOURS * 60
    start = this_minute - timedelta(minutes=minutes - 1)
    # Index-only on event_tenant_created (tenant, -created_at, -id): the window's rows, nothing else.
    rows = (
        TransitionEvent.objects.filter(tenant_id__in=tenant_ids, created_at__gte=start)
        .annotate(minute=TruncMinute("created_at"))
        .values("minute")
        .annotate(n=Count("pk"))
        .order_by()
    )
    per_minute = [0] * minutes
    for row in rows:
        slot = int((row["minute"] - start).total_seconds() // 60)
        if 0 <= slot < minutes:
            per_minute[slot] += row["n"]
    latencies = approval_latencies(tenant_ids, since=now - timedelta(hours=LATENCY_HOURS))
    return Trend(
        now,
        tuple(per_minute),
        len(latencies),
        _quantile(latencies, 0.5),
        _quantile(latencies, 0.9),
    )


def approval_latencies(tenant_ids: Sequence[int], *, since: datetime) -> tuple[float, ...]:
    """Seconds from request to decision of each request of these tenants decided since ``since``, sorted.

    Decided by a person only (approved or rejected): an expiry is nobody's decision.
    """
    rows = ApprovalRequest.objects.filter(
        Q(status=ApprovalStatus.APPROVED) | Q(status=ApprovalStatus.REJECTED),
        tenant_id__in=tenant_ids,
        decided_at__gte=since,
    ).values_list("created_at", "decided_at")
    return tuple(
        sorted(
            max((decided - created).total_seconds(), 0.0) for created, decided in rows if decided is not None
        )
    )


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (linear between neighbours, as ``percentile_cont``)."""
    if not ordered:
        return None
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
