"""Celery entry points of the approvals app."""

from __future__ import annotations

from celery import shared_task

from approvals import services


@shared_task(name="approvals.expire_pending")
def expire_pending() -> int:
    return services.expire_pending()
