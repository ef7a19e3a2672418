"""What model turns used and cost, by task type, for a set of tenants: the dashboard's usage table.

The same rows the task page sums per task (``runtime.ModelUsage``: every turn billed, a scripted
workflow's turns and an SDK agent's alike), summed over a recent window per task type. One grouped
query joining each usage row to its task (for the tenant and the type), kept for
``METRICS_CACHE_SECONDS`` per set of tenants like the dashboard's other windowed figures.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, Sum
from django.utils import timezone

from runtime.models import ModelUsage

USAGE_HOURS = 24


@dataclass(frozen=True)
class TypeUsage:
    """One task type's model turns in the window. ``cost`` is None when any turn had no price: a partial
    sum would read as the whole bill (``unpriced`` says how many)."""

    task_type: str
    turns: int
    input_tokens: int
    output_tokens: int
    cost: Decimal | None
    unpriced: int


@dataclass(frozen=True)
class UsageWindow:
    since: datetime
    hours: int
    rows: tuple[TypeUsage, ...]  # by task type, alphabetical

    @property
    def turns(self) -> int:
        return sum(row.turns for row in self.rows)


def usage_by_type(tenant_ids: Sequence[int]) -> UsageWindow:
    """``read_usage_by_type`` for these tenants, kept ``METRICS_CACHE_SECONDS`` (per set of tenants)."""
    period = float(settings.METRICS_CACHE_SECONDS)
    key = "durable:usage:" + hashlib.sha256(",".join(map(str, sorted(tenant_ids))).encode()).hexdigest()[:32]
    held: UsageWindow | None = cache.get(key) if period > 0 else None
    if held is not None:
        return held
    fresh = read_usage_by_type(tenant_ids)
    if period > 0:
        cache.set(key, fresh, timeout=period)
    return fresh


def read_usage_by_type(tenant_ids: Sequence[int], now: datetime | None = None) -> UsageWindow:
    since = (now or timezone.now()) - timedelta(hours=USAGE_HOURS)
    rows = (
        ModelUsage.objects.filter(task__tenant_id__in=tenant_ids, recorded_at__gte=since)
        .values("task__task_type")
        .annotate(
            turns=Count("id"),
            tokens_in=Sum("input_tokens"),
            tokens_out=Sum("output_tokens"),
            total_cost=Sum("cost"),
            unpriced=Count("id", filter=Q(cost__isnull=True)),
        )
        .order_by("task__task_type")
    )
    return UsageWindow(
        since,
        USAGE_HOURS,
        tuple(
            TypeUsage(
                task_type=row["task__task_type"],
                turns=row["turns"],
                input_tokens=row["tokens_in"] or 0,
                output_tokens=row["tokens_out"] or 0,
                cost=None if row["unpriced"] else row["total_cost"] or Decimal(0),
                unpriced=row["unpriced"],
            )
            for row in rows
        ),
    )
