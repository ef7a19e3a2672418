"""Maintained rollups: the tasks per tenant and state, recounted by the beat, read with their age.

The transition path writes nothing for them (an extra statement per transition costs every task):
``refresh`` recounts the whole table in one ``GROUP BY`` on the ``(tenant, state)`` index and
replaces ``StateCount`` in one transaction, every ``ROLLUP_INTERVAL`` seconds (Celery beat's
``runtime.rollups_refresh``, or ``run_worker --sweep``). A reader sums its tenants' rows and shows
the number "as of" ``counted_at``: exact at that moment, never a cold read of the tasks in a request.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from runtime.models import StateCount
from tasks.models import Task

# Two recounts at once would insert the same rows: the second one skips (the first is as fresh).
_LOCK = 0x524F4C4C  # "ROLL"


@dataclass(frozen=True)
class Counted:
    n: int
    counted_at: datetime


def refresh(*, now: datetime | None = None) -> int | None:
    """Recount the tasks per tenant and state; return the rows written, or ``None`` when another
    recount holds the lock (PostgreSQL). Readers see the previous counts until this one commits."""
    counted_at = now or timezone.now()
    task_table, table = Task._meta.db_table, StateCount._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_LOCK])
            if not cursor.fetchone()[0]:
                return None
        cursor.execute(f"DELETE FROM {table}")  # noqa: S608 - table names from the models, no input
        cursor.execute(
            f"INSERT INTO {table} (tenant_id, state, n, counted_at) "  # noqa: S608
            f"SELECT tenant_id, state, COUNT(*), %s FROM {task_table} GROUP BY tenant_id, state",
            [counted_at],
        )
        return int(cursor.rowcount)


def state_counts(
    tenant_ids: Sequence[int], groups: Iterable[tuple[str, Sequence[str]]]
) -> dict[str, Counted]:
    """For each ``(label, states)`` of ``groups``, the tasks of ``tenant_ids`` in those states at the
    last recount, and when that was. A label never counted (no recount yet) is left out; a label
    counted with no task reads 0."""
    rows = StateCount.objects.filter(tenant_id__in=list(tenant_ids))
    latest = rows.aggregate(at=Max("counted_at"))["at"]
    if latest is None:
        return {}
    per_state = {row["state"]: row["n"] for row in rows.values("state").annotate(n=Sum("n")).order_by()}
    return {
        label: Counted(sum(per_state.get(state, 0) for state in states), latest) for label, states in groups
    }
