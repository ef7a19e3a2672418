"""The kernel's own read conditions: which tasks are stuck, and which roles a user holds on a task.

The runtime's alerts, the queue's ``stuck`` filter and the task page read the same
``stuck_condition``; the data-protection code asks ``roles_in``. Every other read the
surfaces make lives in ``reads/``, the layer above the runtime.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef, Q

from tasks.models import Lease, Task
from tasks.states import RUNNABLE, WAITING, State
from tenancy.selectors import roles_by_tenant


def stuck_condition(now: datetime) -> Q:
    """Tasks with no valid next event coming: nobody will move them unless someone looks.

    - runnable, yet no worker has held a lease on it for ``STUCK_AFTER`` seconds;
    - a wait whose deadline passed ``STUCK_AFTER`` seconds ago and is still open
      (the sweep is not running);
    - an outcome unknown for longer than ``UNKNOWN_OUTCOME_ESCALATE_AFTER``.
    Waits before their deadline and quarantined tasks are owned states, not stuck.
    Each clause is its own function: ``runtime.alerts`` raises one kind of alert per clause.
    """
    return unattended_condition(now) | overdue_wait_condition(now) | unknown_overdue_condition(now)


def unattended_condition(now: datetime) -> Q:
    """Runnable since over ``STUCK_AFTER`` seconds, and no lease heartbeat in that time."""
    grace = now - timedelta(seconds=settings.STUCK_AFTER)
    return Q(state__in=sorted(RUNNABLE), state_entered_at__lt=grace) & ~Q(
        Exists(Lease.objects.filter(task_id=OuterRef("pk"), heartbeat_at__gt=grace))
    )


def overdue_wait_condition(now: datetime) -> Q:
    """A wait whose deadline passed over ``STUCK_AFTER`` seconds ago (the sweep ends waits at deadlines)."""
    return Q(state__in=sorted(WAITING), wait_deadline__lt=now - timedelta(seconds=settings.STUCK_AFTER))


def unknown_overdue_condition(now: datetime) -> Q:
    """``outcome_unknown`` for longer than ``UNKNOWN_OUTCOME_ESCALATE_AFTER`` seconds."""
    return Q(
        state=State.OUTCOME_UNKNOWN,
        state_entered_at__lt=now - timedelta(seconds=settings.UNKNOWN_OUTCOME_ESCALATE_AFTER),
    )


def roles_in(user: Any, task: Task) -> frozenset[str]:
    """The roles ``user`` holds in ``task``'s tenant (none: an empty set)."""
    return roles_by_tenant(user).get(task.tenant_id, frozenset())
