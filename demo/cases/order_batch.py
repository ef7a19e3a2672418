"""Demo cases of ``order_batch``: a batch the workers run to its end, children first, and a parent
waiting on children queued where no worker runs."""

from __future__ import annotations

from demo.cases.seeding import STUCK_REGION, WORKER_ID, Case, Seeding
from runtime import runner


def batch(seeding: Seeding) -> None:
    seeding.start(
        "batch",
        "order_batch",
        "Look up orders A-110, A-111 and A-112 (one child task each)",
        {"order_ids": ["A-110", "A-111", "A-112"]},
    )


def children(seeding: Seeding) -> None:
    """``waiting_children``: its first run starts the children, in the same region as the parent."""
    if task := seeding.start(
        "children",
        "order_batch",
        f"Look up orders A-115 and A-116 (children queued in region {STUCK_REGION})",
        {"order_ids": ["A-115", "A-116"]},
        region=STUCK_REGION,
    ):
        runner.run_task(task.id, worker_id=WORKER_ID, region=STUCK_REGION)


CASES: tuple[Case, ...] = (batch, children)
