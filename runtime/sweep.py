"""The periodic sweep: the reason losing every broker message loses no work.

1. Waits past their ``wait_deadline`` move on: a retry wait whose backoff ended
   goes to resume validation; another wait expires the task or revalidates it,
   as its task type says.
2. Tasks past their own ``deadline`` expire (from the states that allow it).
3. A parent still waiting on children that have all ended moves on (the
   last child's worker does that itself, unless it died in between).
4. A quarantine an older deployment made over an effect key it computed in
   another scheme, the facts unchanged, is lifted (``runtime.rollout``); ``run_worker --sweep``,
   sweeping every second, does this at beat's pace (``SWEEP_INTERVAL``).
5. Every runnable task of the region without a live lease rings the doorbell
   again (dead leases need no separate step: an expired lease is simply not
   live). A sweep without a doorbell (``ring=None``: ``run_worker --sweep``,
   whose loop claims by polling) skips this query altogether.

Each move is an ordinary transition at the version read; if something else
moved the task first, that task is skipped, not retried.

Every step looks only at tasks of the sweep's own region (``WORKER_REGION``,
or ``region``): a region's sweep never advances a task another region owns, so
after a failover (``runtime.failover``) the old region's sweep, partitioned
and unaware, leaves the moved tasks alone. Step 5 is region-filtered too, so
it reads the claim's own index (``task_runnable``: region, then age) rather
than every runnable task of every region; a region needs its own sweep anyway
(steps 1-4 end its waits), and its doorbell is rung by that sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from ledger.models import IN_DOUBT, Action
from runtime import rollout
from tasks import children, leases, registry
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.states import RUNNABLE, TRANSITIONS, WAITING, State, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
BATCH = 500
SWEEPER = Actor.system("sweep")
DEADLINE_SOURCES = sorted({edge.source for edge in TRANSITIONS if edge.trigger == Trigger.DEADLINE_PASSED})


@dataclass
class SweepReport:
    waits_ended: int = 0
    expired: int = 0
    rung: int = 0
    parents_woken: int = 0
    quarantines_lifted: int = 0


def _move(task: Task, to_state: State, trigger: Trigger, reason: str, **changes: Any) -> bool:
    try:
        advance(
            task.id,
            task.state_version,
            to_state,
            actor=SWEEPER,
            trigger=trigger,
            reason=reason,
            reason_code=trigger,
            **changes,
        )
    except (StaleVersion, TransitionNotAllowed):
        return False  # moved by someone else since we read it
    return True


def _expiry_policy(task: Task) -> str:
    try:
        return registry.get(task.task_type).on_wait_expiry
    except KeyError:  # a task type this deployment no longer has: revalidation will quarantine it
        return "revalidate"


def end_overdue_waits(now: datetime, report: SweepReport, region: str) -> None:
    overdue = Task.objects.filter(state__in=WAITING, wait_deadline__lte=now, region=region).order_by(
        "wait_deadline"
    )[:BATCH]
    for task in overdue:
        if task.state == State.WAITING_RETRY:
            report.waits_ended += _move(
                task, State.RESUME_VALIDATION, Trigger.BACKOFF_ELAPSED, "backoff elapsed"
            )
        elif _expiry_policy(task) == "revalidate":
            report.waits_ended += _move(
                task, State.RESUME_VALIDATION, Trigger.WAIT_EXPIRED, f"{task.state} expired"
            )
        elif _move(
            task,
            State.EXPIRED,
            Trigger.WAIT_EXPIRED,
            f"{task.state} expired",
            outcome={"reason": "wait_expired", "waited_in": task.state},
        ):
            report.expired += 1


def expire_past_deadline(now: datetime, report: SweepReport, region: str) -> None:
    # Not while an effect of the task is in doubt (a send cut short): it is settled first, by its worker
    # (outcome_unknown, then the reconciler), so an expired task never hides an effect that happened.
    in_doubt = Action.objects.filter(task=OuterRef("pk"), dispatch_state__in=IN_DOUBT)
    late = (
        Task.objects.filter(state__in=DEADLINE_SOURCES, deadline__lte=now, region=region)
        .exclude(Exists(in_doubt))
        .order_by("deadline")[:BATCH]
    )
    for task in late:
        report.expired += _move(
            task,
            State.EXPIRED,
            Trigger.DEADLINE_PASSED,
            "task deadline passed",
            outcome={"reason": "deadline_passed"},
        )


Ring = Callable[[UUID, str], None]


def ring_for_eligible(now: datetime, ring: Ring, report: SweepReport, region: str) -> None:
    """Ring for ``region``'s runnable tasks without a live lease, longest waiting first (``BATCH``)."""
    eligible = (
        Task.objects.filter(state__in=RUNNABLE, region=region)
        .exclude(leases.live_lease_exists(now))
        .order_by("state_entered_at")
        .values_list("id", "region")[:BATCH]
    )
    for task_id, region in eligible:
        ring(task_id, region)
        report.rung += 1


def sweep(
    ring: Ring | None,
    *,
    now: datetime | None = None,
    region: str | None = None,
    lift_quarantines: bool = True,
) -> SweepReport:
    """One sweep of ``region``'s tasks (default ``WORKER_REGION``). ``ring``: the doorbell for its
    runnable unleased tasks; None when nothing listens (a polling worker), and that query is skipped.
    ``lift_quarantines=False`` skips step 4: a worker sweeping every second lifts them at beat's pace."""
    now = now or timezone.now()
    region = region or settings.WORKER_REGION
    report = SweepReport()
    end_overdue_waits(now, report, region)
    expire_past_deadline(now, report, region)
    report.parents_woken = children.wake_waiting(region, BATCH)
    if lift_quarantines:
        report.quarantines_lifted = rollout.lift_key_scheme_quarantines(region, BATCH)
    if ring is not None:
        ring_for_eligible(timezone.now(), ring, report, region)
    if report.waits_ended or report.expired or report.quarantines_lifted:
        log.info("sweep", extra=vars(report))
    return report
