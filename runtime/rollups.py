"""Maintained rollups: the tasks per tenant and state, and the dashboard's gauges, recounted by the
beat and read with their age.

The transition path writes nothing for them (an extra statement per transition costs every task):
``refresh`` recounts the whole table in one ``GROUP BY`` on the ``(tenant, state)`` index and
replaces ``StateCount`` in one transaction, then stores the gauges' reading (``runtime.gauges.read``:
per state, type and reason, wait ages, effects in doubt, open alerts) as the ``Reading`` named
``gauges``, every ``ROLLUP_INTERVAL`` seconds (Celery beat's ``runtime.rollups_refresh``, or
``run_worker --sweep``). A reader sums its tenants' rows, or narrows the stored reading, and shows
the number "as of" when it was counted: never a cold read of the tasks in a request, and the same
numbers in every web process (the cache is per process unless ``CACHE_URL`` is shared).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Max, Sum
from django.utils import timezone

from runtime import gauges
from runtime.models import Reading, StateCount
from tasks.models import Task

GAUGES = "gauges"

# Two recounts at once would insert the same rows: the second one skips (the first is as fresh).
_LOCK = 0x524F4C4C  # "ROLL"


@dataclass(frozen=True)
class Counted:
    n: int
    counted_at: datetime


def refresh(*, now: datetime | None = None) -> int | None:
    """Recount the tasks per tenant and state, then store the gauges' reading; return the state rows
    written, or ``None`` when another recount holds the lock (PostgreSQL)."""
    counted = _count_states(now=now)
    if counted is not None:
        store_gauges(gauges.read(now))
    return counted


def _count_states(*, now: datetime | None) -> int | None:
    """Readers see the previous counts until this recount commits."""
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


def store_gauges(reading: gauges.Snapshot) -> None:
    """Keep ``reading`` as the one every dashboard serves until the next."""
    Reading.objects.update_or_create(
        name=GAUGES, defaults={"body": _encoded(reading), "read_at": reading.read_at}
    )


def gauges_reading() -> gauges.Snapshot | None:
    """The last stored gauges' reading, or ``None`` before the first recount. One row read."""
    row = Reading.objects.filter(name=GAUGES).first()
    return None if row is None else _decoded(row.body)


def _encoded(reading: gauges.Snapshot) -> dict[str, Any]:
    return {
        "read_at": reading.read_at.isoformat(),
        "took": reading.took,
        "tasks": [[r.tenant_id, r.state, r.task_type, r.reason, r.region, r.n] for r in reading.tasks],
        "waits": [[r.tenant_id, r.state, list(r.counts), r.total_seconds] for r in reading.waits],
        "unknown": [[tenant, n, since.isoformat()] for tenant, n, since in reading.unknown],
        "unleased": [[region, since.isoformat()] for region, since in reading.unleased],
        "alerts": None if reading.alerts is None else [list(row) for row in reading.alerts],
    }


def _decoded(body: dict[str, Any]) -> gauges.Snapshot:
    when = datetime.fromisoformat
    return gauges.Snapshot(
        read_at=when(body["read_at"]),
        took=float(body["took"]),
        tasks=tuple(gauges.TaskCount(*row) for row in body["tasks"]),
        waits=tuple(
            gauges.WaitAges(tenant, state, tuple(counts), float(total))
            for tenant, state, counts, total in body["waits"]
        ),
        unknown=tuple((tenant, n, when(since)) for tenant, n, since in body["unknown"]),
        unleased=tuple((region, when(since)) for region, since in body["unleased"]),
        alerts=None if body["alerts"] is None else tuple(tuple(row) for row in body["alerts"]),
    )
