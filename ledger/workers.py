"""Celery entry points of the ledger."""

from __future__ import annotations

from celery import shared_task

from ledger import reconcile


@shared_task(name="ledger.reconcile_unknown")
def reconcile_unknown() -> int:
    return reconcile.reconcile_unknown()
