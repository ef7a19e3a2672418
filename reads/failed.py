"""The failed-tasks triage list: tasks that ended ``failed``, grouped by their reason code, newest first.

The twin of ``reads.quarantine`` for the terminal state an operator answers with a rerun. A failed task
never leaves its state, so ``state_reason`` is the code of the failure itself (no self-loop rewrites it).
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, Q, QuerySet

from reads.quarantine import QuarantineCursor, QuarantinePage
from tasks.models import Task
from tasks.states import State


def _failed(tenant_ids: list[int]) -> QuerySet[Task]:
    return Task.objects.filter(tenant_id__in=tenant_ids, state=State.FAILED)


def failed_counts(tenant_ids: list[int]) -> list[dict[str, Any]]:
    """Failed tasks per reason code, most first: one GROUP BY query.

    Each row: ``code``, ``n``, ``newest`` (the latest failure's ``state_entered_at``).
    """
    rows = (
        _failed(tenant_ids)
        .values("state_reason")
        .annotate(n=Count("id"), newest=Max("state_entered_at"))
        .order_by("-n", "state_reason")
    )
    return [{"code": row["state_reason"], "n": row["n"], "newest": row["newest"]} for row in rows]


def failed_tasks(
    tenant_ids: list[int], *, code: str, before: QuarantineCursor | None, limit: int
) -> QuarantinePage:
    """One page of the tasks that failed for ``code``, the latest failure first. One query, tenants joined."""
    tasks = _failed(tenant_ids).filter(state_reason=code)
    if before is not None:
        tasks = tasks.filter(
            Q(state_entered_at__lt=before.entered_at)
            | Q(state_entered_at=before.entered_at, id__lt=before.id)
        )
    rows = list(
        tasks.select_related("tenant").defer("input").order_by("-state_entered_at", "-id")[: limit + 1]
    )
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return QuarantinePage(
        rows[:limit], QuarantineCursor(last.state_entered_at, last.id) if last is not None else None
    )
