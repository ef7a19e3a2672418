"""Celery entry points of the audit app (beat: ``audit-anchor`` in ``CELERY_BEAT_SCHEDULE``)."""

from __future__ import annotations

from celery import shared_task

from audit.anchor import write_anchor


@shared_task(name="audit.anchor")
def anchor() -> str:
    """Write one anchor to ``AUDIT_ANCHOR_DIR``; its path (for the worker's log)."""
    return str(write_anchor().path)
