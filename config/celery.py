"""The Celery app: a doorbell, not the memory.

Messages only say "task X may be runnable"; PostgreSQL holds every fact. With
no ``CELERY_BROKER_URL`` the broker is kombu's filesystem transport under
``var/broker`` — a real broker between real processes, on one host, with no
server to install.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from celery import Celery
from celery.signals import after_setup_logger, after_setup_task_logger, worker_init, worker_process_init

from audit.redaction import RedactingFilter
from config import otel

if TYPE_CHECKING:  # the web processes import this module too: they need no worker machinery
    from celery.worker import WorkController

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["protection", "runtime", "approvals", "audit"], related_name="workers")


@worker_process_init.connect
def _trace_worker(**kwargs: object) -> None:
    otel.configure(celery=True)  # per pool process: exporters do not survive fork


@worker_init.connect
def _trace_unforked_worker(sender: WorkController | None = None, **kwargs: object) -> None:
    # The threads pool (the embedded broker's, see settings) forks no pool processes: trace here.
    pool = getattr(sender, "pool_cls", "")
    if "prefork" not in (pool if isinstance(pool, str) else pool.__module__):
        otel.configure(celery=True)


@after_setup_logger.connect
@after_setup_task_logger.connect
def _redact_worker_logs(logger: logging.Logger | None = None, **kwargs: object) -> None:
    # Celery replaces the handlers LOGGING installed with its own: redact on those too.
    for handler in getattr(logger, "handlers", ()):
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
