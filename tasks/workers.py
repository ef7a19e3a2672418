"""Celery entry points: take ids, call one service. Business rules live elsewhere."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from celery import shared_task
from django.conf import settings

from tasks import doorbell, runner, sweep


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@shared_task(name="tasks.run_task")
def run_task(task_id: str) -> str:
    return runner.run_task(
        task_id,
        worker_id=worker_id(),
        region=settings.WORKER_REGION,
        ttl=timedelta(seconds=settings.LEASE_TTL_SECONDS),
    )


@shared_task(name="tasks.sweep")
def sweep_task() -> dict[str, int]:
    return vars(sweep.sweep(doorbell.ring))
