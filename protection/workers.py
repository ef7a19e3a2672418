"""Celery entry points of data protection (beat: ``retention`` in ``CELERY_BEAT_SCHEDULE``)."""

from __future__ import annotations

import logging

from celery import shared_task

from protection import retention

logger = logging.getLogger(__name__)


# The name it had in the kernel: beat schedules and queued messages already name it.
@shared_task(name="tasks.retention")
def run_retention() -> str:
    """Archive and delete what the retention policies make due (``manage.py retention``'s function).

    Beat connects as the application's role, which can neither erase a task's input nor delete
    history: there this logs how many archives and deletions await a run as the owner role.
    """
    report = retention.run(dry_run=False)
    waiting = report.total("awaiting_owner")
    if waiting:
        logger.warning(
            "retention: %s tasks due for archiving or deletion await `manage.py retention` as the owner",
            waiting,
        )
    return f"{report.archived} archived, {report.deleted} deleted, {waiting} awaiting the owner"
