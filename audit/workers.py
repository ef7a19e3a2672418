"""Celery entry points of the audit app (beat: ``audit-anchor`` in ``CELERY_BEAT_SCHEDULE``)."""

from __future__ import annotations

from celery import shared_task

from audit.anchor import anchor_if_due as write_if_due
from audit.anchor import write_anchor


@shared_task(name="audit.anchor")
def anchor() -> str:
    """Write one anchor to ``AUDIT_ANCHOR_DIR``; its path (for the worker's log)."""
    return str(write_anchor().path)


@shared_task(name="audit.anchor_if_due")
def anchor_if_due() -> str:
    """Beat's poll: an anchor when the interval passed or a doorbell rang (``audit.anchor.anchor_if_due``)."""
    written = write_if_due()
    return str(written.path) if written is not None else "not due"
