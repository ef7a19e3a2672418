"""Ring a region's workers: "task X may be runnable". Best effort by design.

The message carries only an id. Losing it costs latency, never work: the
sweep finds every runnable task without a live lease in the database.
"""

from __future__ import annotations

import logging
from uuid import UUID

from config.celery import app

log = logging.getLogger(__name__)


def ring(task_id: UUID | str, region: str) -> None:
    try:
        app.send_task("tasks.run_task", args=[str(task_id)], queue=f"region.{region}", retry=False)
    except Exception:  # a broker outage must never fail the commit that preceded it
        log.warning(
            "doorbell failed; the sweep will find the task", extra={"task_id": str(task_id)}, exc_info=True
        )
