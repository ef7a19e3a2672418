"""Legal holds: while one is in force on a task, retention neither archives nor deletes it.

Tenant admins place and lift them, with a reason, on the task page or over the API; each hold is
a ``tasks.models.LegalHold`` row kept when it is lifted, so the rows are the record of every
hold. Retention (``protection.retention``) skips a task with a hold in force, deciding under the
same row lock ``set_legal_hold`` takes.
"""

from __future__ import annotations

from django.db import models, transaction
from django.utils import timezone

from tasks.exceptions import TaskNotFound
from tasks.models import LegalHold, Task


def holds_in_force() -> models.QuerySet[LegalHold]:
    return LegalHold.objects.filter(lifted_at__isnull=True)


def set_legal_hold(task: Task, *, hold: bool, by: str, reason: str) -> bool:
    """Place (``hold``) or lift the legal hold on ``task``; True when that changed anything.

    Placing a hold on a held task, or lifting one from a task without, changes nothing. The task
    row is locked first, as retention locks it before deciding, so a hold placed while a run is
    deciding is either seen by it or waits for it. Raises ``TaskNotFound`` when the task is gone.
    """
    now = timezone.now()
    with transaction.atomic():
        if not Task.objects.select_for_update().filter(pk=task.pk).exists():
            raise TaskNotFound(f"task {task.pk} does not exist")
        in_force = holds_in_force().filter(task_id=task.pk)
        if hold:
            if in_force.exists():
                return False
            LegalHold.objects.create(task_id=task.pk, placed_by=by, reason=reason, placed_at=now)
            return True
        return in_force.update(lifted_by=by, lift_reason=reason, lifted_at=now) == 1
