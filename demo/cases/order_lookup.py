"""Demo cases of ``order_lookup``: one for the workers to run, a retry the sweep resumes soon, one
whose backoff runs for hours, and one stuck in a region where no worker runs."""

from __future__ import annotations

from demo.cases.seeding import STUCK_REGION, Case, Seeding, task_facts
from tasks import checkpoints
from tasks.states import State, Trigger


def lookup(seeding: Seeding) -> None:
    seeding.start("lookup", "order_lookup", "Look up order A-107", {"order_id": "A-107"})


def retry(seeding: Seeding) -> None:
    """A short retry wait: the running demo's sweep resumes it."""
    if task := seeding.start(
        "retry", "order_lookup", "Look up order A-104 (order system was unavailable)", {"order_id": "A-104"}
    ):
        progress = checkpoints.Progress(step="lookup", facts=task_facts(task))
        seeding.wait(task, State.WAITING_RETRY, Trigger.ATTEMPT_FAILED, progress, hours=0.01, attempt=1)


def retry_long(seeding: Seeding) -> None:
    """A retry whose backoff runs for hours: still waiting while the demo runs."""
    if task := seeding.start(
        "retry-long",
        "order_lookup",
        "Look up order A-114 (order system down; next attempt in 12 hours)",
        {"order_id": "A-114"},
    ):
        seeding.wait(
            task,
            State.WAITING_RETRY,
            Trigger.ATTEMPT_FAILED,
            checkpoints.Progress(step="lookup", facts=task_facts(task)),
            hours=12,
            reason="orders answered 503",
            reason_code="evidence_unavailable",
            attempt=2,
        )


def stuck(seeding: Seeding) -> None:
    """Runnable, but in a region where no worker runs, so nobody ever leases it."""
    seeding.start(
        "stuck",
        "order_lookup",
        f"Look up order A-113 (queued in region {STUCK_REGION}, where no worker runs)",
        {"order_id": "A-113"},
        region=STUCK_REGION,
    )


CASES: tuple[Case, ...] = (retry, lookup, stuck, retry_long)
