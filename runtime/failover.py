"""Failover: move every unfinished task of one region to another, fencing the old region out.

A task is advanced by one region at a time. Its ``region`` says which workers
may claim it and its ``ownership_epoch`` fences every commit: a worker's lease
carries the epoch read when it was claimed (``tasks.leases.Held``), and the
transition's compare-and-set requires it still (``StaleEpoch`` otherwise). A
failover bumps the epoch, so a worker of the old region that never heard of it
(partitioned, paused) cannot commit, claim a send or record an answer for a
task it lost, even with a lease it believes live.

For each unfinished task of ``from_region``, oldest id first, in keyset batches:

1. Verify: its newest checkpoint verifies and decodes with this code
   (``tasks.services.latest_checkpoint``), and no ledger action of it is in
   doubt (``dispatching`` or ``unknown``). The ledger records a reconciliation
   by moving the action itself to ``reconciled_*``: an action still in doubt
   has none, and the new region would resume without knowing whether its
   effect happened. Such a task is reported as blocked, with the reason, and
   stays where it is (its region's reconciler, or an operator, settles it;
   then the failover is run again).
2. Move: one transition per task, a ``failover`` self-loop by the system
   (``region`` := ``to_region``, ``ownership_epoch`` += 1) that in the same
   commit ends the task's lease (its holder's heartbeat and its next send
   claim fail) and checks the ledger again with the task's action rows
   locked, so a send claimed since step 1 blocks the move instead of
   travelling with it. A task the old region advanced meanwhile (it still
   runs, unaware) is read, verified and moved again at its new version; one
   that ended meanwhile, or that another failover moved, is skipped.
3. After each commit: ring the doorbell of a runnable task in its new region.

Running it twice moves nothing the second time: the moved tasks are no longer
in ``from_region``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from uuid import UUID

from django.utils import timezone

from ledger.models import IN_DOUBT, Action
from tasks import services
from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Lease, Task
from tasks.states import NON_TERMINAL, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
BATCH = 500
FAILOVER = Actor.system("failover")
IN_DOUBT_ACTION = "action_in_doubt"
KEPT_MOVING = "kept_moving"
# How often one task is read again after the old region (still running) advanced it under our feet.
MOVE_ATTEMPTS = 5
REGION_LENGTH = Task._meta.get_field("region").max_length or 32


@dataclass(frozen=True)
class Blocked:
    """A task the failover did not move, and why (``reason`` is machine-readable)."""

    task_id: UUID
    state: str
    reason: str
    detail: str


@dataclass
class FailoverReport:
    from_region: str
    to_region: str
    dry_run: bool
    verified: int = 0  # passed verification (in a dry run: would move; moved or skipped otherwise)
    moved: list[UUID] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    skipped: list[UUID] = field(default_factory=list)  # ended, or moved by another failover, meanwhile


class _InDoubt(Exception):
    """Raised inside the move's transaction: a send was claimed since the task was verified."""


def check_regions(from_region: str, to_region: str) -> None:
    """Refuse (``ValueError``) a blank region, one longer than the column, or a failover onto itself."""
    for name, value in (("from", from_region), ("to", to_region)):
        if not value or not value.strip():
            raise ValueError(f"the {name} region must not be empty")
        if len(value) > REGION_LENGTH:
            raise ValueError(f"the {name} region is longer than {REGION_LENGTH} characters")
    if from_region == to_region:
        raise ValueError(f"cannot fail region {from_region!r} over to itself")


def failover(
    from_region: str,
    to_region: str,
    *,
    reason: str = "",
    actor: Actor = FAILOVER,
    dry_run: bool = False,
    batch: int = BATCH,
    on_blocked: Callable[[Blocked], None] | None = None,
) -> FailoverReport:
    """Move every unfinished task of ``from_region`` that verifies to ``to_region`` (see the module
    docstring); report what moved, what was blocked and why, and what moved meanwhile.

    ``dry_run`` verifies and reports, moving nothing. ``on_blocked`` hears of each blocked task as it
    is found (a command prints it at once). Raises ``ValueError`` for bad region names.
    """
    check_regions(from_region, to_region)
    report = FailoverReport(from_region, to_region, dry_run)
    after: UUID | None = None
    while True:
        # Keyset on id, not OFFSET: moved tasks leave the filter, and 100k tasks stay a few reads each.
        rows = Task.objects.filter(region=from_region, state__in=sorted(NON_TERMINAL))
        if after is not None:
            rows = rows.filter(id__gt=after)
        tasks = list(rows.order_by("id")[:batch])
        if not tasks:
            return report
        after = tasks[-1].id
        doubts = _in_doubt([task.id for task in tasks])
        for task in tasks:
            blocked = _verify(task, doubts.get(task.id, []))
            if blocked is None:
                report.verified += 1
                if not dry_run:
                    blocked = _move(task, from_region, to_region, actor, reason, report)
            if blocked is not None:
                report.blocked.append(blocked)
                log.warning(
                    "failover blocked",
                    extra={"task_id": str(task.id), "reason": blocked.reason, "detail": blocked.detail},
                )
                if on_blocked is not None:
                    on_blocked(blocked)


def _in_doubt(task_ids: list[UUID]) -> dict[UUID, list[str]]:
    """The in-doubt actions of these tasks, described, by task (one query; ``action_in_doubt`` index)."""
    found: dict[UUID, list[str]] = {}
    rows = Action.objects.filter(task_id__in=task_ids, dispatch_state__in=sorted(IN_DOUBT)).order_by("id")
    for action in rows.only("id", "task_id", "step", "connector", "dispatch_state", "checked_at"):
        found.setdefault(action.task_id, []).append(_describe(action))
    return found


def _describe(action: Action) -> str:
    looked = f", last looked up {action.checked_at:%Y-%m-%d %H:%M:%S}" if action.checked_at else ""
    return f"action #{action.pk} ({action.connector}, step {action.step}) is {action.dispatch_state}{looked}"


def _verify(task: Task, doubts: list[str]) -> Blocked | None:
    try:
        services.latest_checkpoint(task)
    except CheckpointUnreadable as exc:
        return Blocked(task.id, task.state, exc.reason, exc.detail)
    if doubts:
        return Blocked(task.id, task.state, IN_DOUBT_ACTION, "; ".join(doubts) + " with no reconciliation")
    return None


def _move(
    task: Task, from_region: str, to_region: str, actor: Actor, reason: str, report: FailoverReport
) -> Blocked | None:
    """Move one verified task; None when it moved (or was skipped), else why it was blocked.

    The old region may still be running and advance the task between our read and our move (its
    commits are fenced only once the epoch moved): the task is then read again, verified again and
    moved at its new version. One that ended meanwhile, or that another failover moved, is skipped.
    """
    for _ in range(MOVE_ATTEMPTS):
        try:
            moved = _transition(task, to_region, actor, reason)
        except _InDoubt:
            doubts = _in_doubt([task.id]).get(task.id, ["an action was claimed for sending meanwhile"])
            return Blocked(
                task.id, task.state, IN_DOUBT_ACTION, "; ".join(doubts) + " with no reconciliation"
            )
        except (StaleVersion, TransitionNotAllowed):
            again = Task.objects.filter(
                pk=task.id, region=from_region, state__in=sorted(NON_TERMINAL)
            ).first()
            if again is None:
                report.skipped.append(task.id)
                return None
            task = again
            blocked = _verify(task, _in_doubt([task.id]).get(task.id, []))
            if blocked is not None:
                return blocked
            continue
        report.moved.append(moved.id)
        services.ring_if_runnable(moved)  # committed: its new region's workers hear of it now
        return None
    return Blocked(
        task.id,
        task.state,
        KEPT_MOVING,
        f"advanced {MOVE_ATTEMPTS} times while being moved: run the failover again",
    )


def _transition(task: Task, to_region: str, actor: Actor, reason: str) -> Task:
    """The failover transition of ``task`` at the version read, ending its lease in the same commit."""
    epoch = task.ownership_epoch + 1

    def end_lease_and_recheck() -> None:
        # Ended, not released: heartbeat_at is left alone, so the new region's claim records a
        # takeover from the old holder. Its token stays: the epoch is what fences it now.
        now = timezone.now()
        Lease.objects.filter(task_id=task.id, expires_at__gt=now).update(expires_at=now)
        # Locked: a send claim still uncommitted is waited for and then seen here.
        actions = Action.objects.select_for_update().filter(task_id=task.id)
        if any(state in IN_DOUBT for state in actions.values_list("dispatch_state", flat=True)):
            raise _InDoubt

    return advance(
        task.id,
        task.state_version,
        task.state,
        actor=actor,
        trigger=Trigger.FAILOVER,
        reason=(
            f"failover {task.region} -> {to_region} (epoch {task.ownership_epoch} -> {epoch})"
            + (f": {reason}" if reason else "")
        ),
        reason_code=Trigger.FAILOVER,
        region=to_region,
        ownership_epoch=epoch,
        also=[end_lease_and_recheck],
    )
