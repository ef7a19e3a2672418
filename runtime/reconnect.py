"""Riding through a database restart or failover: what a worker does when PostgreSQL goes away.

A worker that loses its connection must neither exit nor spin. ``recover``:

1. drops the broken connection — outside the request cycle Django never
   replaces one by itself, so every later query would fail on it;
2. waits (exponential backoff with full jitter, capped at a few seconds, so a
   fleet of workers does not reconnect in lockstep) and tries again;
3. once PostgreSQL answers, gives back the leases this worker held when the
   connection broke: their tasks would otherwise wait out ``LEASE_TTL`` before
   any worker, this one included, could resume them.

Used by ``manage.py run_worker`` around each round and by the Celery
``tasks.run_task`` entry point around each run.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from django.db import InterfaceError, OperationalError, connections

from tasks import leases

log = logging.getLogger(__name__)

# What a lost, refused or reset connection raises (psycopg's errors, wrapped by Django). Data errors
# (IntegrityError, DataError, ...) are not here: retrying cannot help them.
CONNECTION_LOST = (OperationalError, InterfaceError)


@dataclass
class Backoff:
    """Exponential backoff with full jitter: the n-th wait is uniform in [base, min(cap, base * 2**n)]."""

    base: float = 0.1
    cap: float = 2.0
    attempt: int = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.attempt)
        self.attempt += 1
        return random.uniform(self.base, max(self.base, ceiling))


def drop_connections() -> None:
    """Close every database connection of this thread, broken or not; the next query opens a new one."""
    for conn in connections.all(initialized_only=True):
        # Closing a dead socket may complain; the wrapper forgets the connection either way.
        with contextlib.suppress(*CONNECTION_LOST):
            conn.close()


def recover(
    worker_id: str,
    error: Exception,
    *,
    task_id: UUID | str | None = None,
    stopping: Callable[[], bool] = lambda: False,
    give_up_after: float | None = None,
    release: bool = True,
) -> bool:
    """After ``error`` broke the connection: wait until PostgreSQL answers, then release leftover leases.

    Releases every live lease of ``worker_id`` (only ``task_id``'s when given: a
    process running several tasks at once must not give up its siblings'; none
    with ``release=False``: the caller held none, e.g. a loop whose slots hold them).
    Returns False, without having reached the database, if ``stopping()`` turned
    true or ``give_up_after`` seconds passed first.
    """
    log.warning("database connection lost (%s: %s); reconnecting", type(error).__name__, error)
    started = time.monotonic()
    backoff = Backoff()
    while True:
        drop_connections()
        pause = time.monotonic() + backoff.next()
        while time.monotonic() < pause:
            if stopping() or (give_up_after is not None and time.monotonic() - started > give_up_after):
                return False
            time.sleep(min(0.1, max(0.0, pause - time.monotonic())))
        try:
            if release:
                released = leases.release_abandoned(worker_id, task_id=task_id)
            else:
                released = 0
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT 1")
        except CONNECTION_LOST as still_down:
            log.info("database still unavailable (%s)", type(still_down).__name__)
            continue
        log.warning(
            "database back after %.1fs; released %d lease(s) held when it went away",
            time.monotonic() - started,
            released,
        )
        return True
