"""Leases: short, fenced claims on runnable tasks.

A worker claims a task before running its steps, heartbeats while it works
and releases the lease when it stops. A worker that dies simply stops
heartbeating: its lease lapses and the task — whose state only ever changed
through committed transitions — becomes claimable again.

On PostgreSQL the claim locks candidate task rows with ``FOR UPDATE SKIP
LOCKED``, so concurrent claimers never wait on each other and never claim the
same task. SQLite (demo only) ignores that clause; there the lease row's
compare-and-set is what keeps a claim single.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from tasks.models import Lease, Task
from tasks.states import RUNNABLE

DEFAULT_TTL = timedelta(seconds=30)


@dataclass(frozen=True)
class Held:
    """A lease this process holds: what it passes to ``advance(lease=…)``."""

    task_id: UUID
    worker_id: str
    token: int


def live_lease_exists(now: datetime):
    """Subquery: the outer task has a lease that has not expired at ``now``."""
    return Exists(Lease.objects.filter(task_id=OuterRef("pk"), expires_at__gt=now))


def _take(task_id: UUID, worker_id: str, now: datetime, ttl: timedelta) -> Held | None:
    """Inside a transaction holding the task row: take its lease if none is live."""
    expires = now + ttl
    taken = Lease.objects.filter(task_id=task_id, expires_at__lte=now).update(
        worker_id=worker_id, token=F("token") + 1, acquired_at=now, heartbeat_at=now, expires_at=expires
    )
    if not taken:
        try:
            with transaction.atomic():
                Lease.objects.create(
                    task_id=task_id,
                    worker_id=worker_id,
                    token=1,
                    acquired_at=now,
                    heartbeat_at=now,
                    expires_at=expires,
                )
        except IntegrityError:
            return None  # a live lease exists (or another claimer inserted first)
    token = Lease.objects.filter(task_id=task_id).values_list("token", flat=True).get()
    return Held(task_id, worker_id, token)


def claim(task_id: UUID | str, *, worker_id: str, region: str, ttl: timedelta = DEFAULT_TTL) -> Held | None:
    """Claim one task if it is runnable in ``region`` and nobody holds a live lease."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        task = (
            Task.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(pk=task_id, state__in=RUNNABLE, region=region)
            .only("id")
            .first()
        )
        if task is None:
            return None
        return _take(task.id, worker_id, now, ttl)


def claim_next(*, worker_id: str, region: str, limit: int = 1, ttl: timedelta = DEFAULT_TTL) -> list[Held]:
    """Claim up to ``limit`` runnable tasks of ``region`` without a live lease, oldest first."""
    now = timezone.now()
    with transaction.atomic(durable=True):
        candidates = list(
            Task.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state__in=RUNNABLE, region=region)
            .exclude(live_lease_exists(now))
            .order_by("state_entered_at")
            .values_list("id", flat=True)[:limit]
        )
        held = [_take(task_id, worker_id, now, ttl) for task_id in candidates]
    return [lease for lease in held if lease is not None]


def heartbeat(lease: Held, *, ttl: timedelta = DEFAULT_TTL) -> bool:
    """Extend a lease still held with this token; False means it was lost."""
    now = timezone.now()
    return bool(
        Lease.objects.filter(task_id=lease.task_id, token=lease.token, expires_at__gt=now).update(
            heartbeat_at=now, expires_at=now + ttl
        )
    )


def release(lease: Held) -> None:
    """Give the lease up at once (the row stays, so tokens keep growing)."""
    now = timezone.now()
    Lease.objects.filter(task_id=lease.task_id, token=lease.token).update(expires_at=now, heartbeat_at=now)
