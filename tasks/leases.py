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

from audit.models import LeaseTakeover
from tasks.models import Lease, Task
from tasks.states import RUNNABLE

DEFAULT_TTL = timedelta(seconds=30)


@dataclass(frozen=True)
class Held:
    """A lease this process holds: what it passes to ``advance(lease=…)``."""

    task_id: UUID
    worker_id: str
    token: int


def live_lease_exists(now: datetime) -> Exists:
    """Subquery: the outer task has a lease that has not expired at ``now``."""
    return Exists(Lease.objects.filter(task_id=OuterRef("pk"), expires_at__gt=now))


def _take(task_id: UUID, worker_id: str, now: datetime, ttl: timedelta) -> Held | None:
    """Inside a transaction holding the task row: take its lease if none is live.

    Taking a lease that lapsed in another worker's hands (it stopped
    heartbeating; it did not release) writes a ``LeaseTakeover`` record in the
    same transaction: who took it, from whom, and the token that went stale.
    """
    expires = now + ttl
    # Lock the lease row: the holder's heartbeat (an UPDATE) waits, then finds the token moved on.
    previous = Lease.objects.select_for_update().filter(task_id=task_id).first()
    if previous is None:
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
            return None  # another claimer inserted first
        return Held(task_id, worker_id, 1)
    if previous.expires_at > now:
        return None  # a live lease exists
    # Compare-and-set on the token read above: SQLite takes no row lock, this keeps the claim single.
    taken = Lease.objects.filter(task_id=task_id, token=previous.token, expires_at__lte=now).update(
        worker_id=worker_id, token=F("token") + 1, acquired_at=now, heartbeat_at=now, expires_at=expires
    )
    if not taken:
        return None
    held = Held(task_id, worker_id, previous.token + 1)
    # release() ends a lease with heartbeat_at == expires_at; a lapsed one was still due a heartbeat.
    if previous.worker_id != worker_id and previous.heartbeat_at < previous.expires_at:
        LeaseTakeover.objects.create(
            task_id=task_id,
            worker_id=worker_id,
            token=held.token,
            previous_worker_id=previous.worker_id,
            stale_token=previous.token,
            previous_heartbeat_at=previous.heartbeat_at,
            previous_expires_at=previous.expires_at,
            taken_at=now,
        )
    return held


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


def fence(lease: Held, *, live: bool = True) -> Exists:
    """The condition a write made on a task's behalf carries in its own statement: ``lease``
    is still the task's lease (its token unchanged: nobody claimed the task since) and, if
    ``live``, not yet expired."""
    rows = Lease.objects.filter(task_id=lease.task_id, token=lease.token, worker_id=lease.worker_id)
    return Exists(rows.filter(expires_at__gt=timezone.now()) if live else rows)


def heartbeat(lease: Held, *, ttl: timedelta = DEFAULT_TTL) -> bool:
    """Extend a lease still held with this token; False means it was lost."""
    now = timezone.now()
    return bool(
        Lease.objects.filter(task_id=lease.task_id, token=lease.token, expires_at__gt=now).update(
            heartbeat_at=now, expires_at=now + ttl
        )
    )


def release(lease: Held, *, hold: timedelta | None = None) -> None:
    """Give the lease up (the row stays, so tokens keep growing): at once, or after ``hold``.

    A hold keeps other workers (and the sweep's doorbell) off a task that has
    nothing to do for a while, e.g. a cancel waiting for an effect that may
    still land, instead of claiming it again in a tight loop.
    """
    now = timezone.now()
    until = now + hold if hold else now
    # heartbeat_at == expires_at marks a lease given up, not lapsed: the next claim is no takeover.
    Lease.objects.filter(task_id=lease.task_id, token=lease.token).update(
        expires_at=until, heartbeat_at=until
    )


def release_abandoned(worker_id: str, *, task_id: UUID | str | None = None) -> int:
    """Let the live leases ``worker_id`` left behind lapse now (only ``task_id``'s if given); count them.

    For a holder known to have stopped working on them: a worker whose database
    connection broke mid-task, or a pool process that died. Without this their
    tasks would wait out the TTL before anyone could resume them. The lease
    lapses as if its TTL had run out (``heartbeat_at`` is left alone, so the next
    claim counts as a takeover, not a clean release). Safe even if the holder
    were still at work: the token stays, so its next write is fenced off.
    """
    now = timezone.now()
    # A lease given up with a hold (heartbeat_at == expires_at) was not abandoned: it keeps its hold.
    abandoned = Lease.objects.filter(
        worker_id=worker_id, expires_at__gt=now, heartbeat_at__lt=F("expires_at")
    )
    if task_id is not None:
        abandoned = abandoned.filter(task_id=task_id)
    return abandoned.update(expires_at=now)
