"""One task's detail: what the task page and ``GET /api/tasks/{id}/`` show, read once."""

from __future__ import annotations

from django.db.models import Count

from ledger.models import Action
from tasks.models import Task


def ledger_summary(task: Task) -> dict[str, int]:
    """How many of the task's actions stand in each dispatch state (one GROUP BY)."""
    rows = Action.objects.filter(task=task).values("dispatch_state").annotate(n=Count("id"))
    return {row["dispatch_state"]: row["n"] for row in rows}
