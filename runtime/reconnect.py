"""Riding through a database restart or failover: what a worker does when PostgreSQL goes away or refuses.

A worker must neither exit nor spin when the database is lost (a restart, a
failover) or answers but refuses our writes (a demoted primary or a reader
behind the writer's address: "read-only transaction"; an administrator's or a
crash's shutdown; a server still in recovery; too many connections). Those
server states (``REFUSING``, by SQLSTATE) are treated as a lost connection;
a transaction that lost to another (``CONFLICT``) is simply tried again; any
other database error is survived too, as "unclassified" (STYLE: a long loop
survives every database error it cannot classify). ``recover``:

1. logs and counts the error by what it means (``classify``: its SQLSTATE,
   ``durable_worker_database_errors_total``);
2. drops this thread's connections and, when the server's state is to blame,
   the idle sessions of the process's pool (``runtime.db.drain_pool``) —
   outside the request cycle Django never replaces a broken connection by
   itself, and a session opened while the server was read-only stays
   read-only after it is writable again;
3. waits (exponential backoff with full jitter, capped at a few seconds, so a
   fleet of workers does not reconnect in lockstep) and tries again, until the
   database answers *and takes writes*;
4. then gives back the leases this worker held when the connection broke:
   their tasks would otherwise wait out ``LEASE_TTL`` before any worker, this
   one included, could resume them. A transition interrupted meanwhile either
   committed or did not (one transaction); the task resumes from what did.

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

from django.db import DatabaseError, InterfaceError, OperationalError, connections

from config.outage import REFUSING, sqlstate
from runtime import db
from tasks import leases, metrics
from tasks.backoff import capped_backoff

log = logging.getLogger(__name__)

# What a lost, refused or reset connection raises (psycopg's errors, wrapped by Django). Data errors
# (IntegrityError, DataError, ...) are not here: retrying cannot help them.
CONNECTION_LOST = (OperationalError, InterfaceError)
# REFUSING (config.outage, the list the web's 503 reads too): server states that mean "this server
# cannot take our writes now", by SQLSTATE, handled like a lost connection whatever class psycopg gives.
# Another transaction won (serialization failure, deadlock): the server is fine, the transaction is
# retried — no sessions to drop beyond this thread's, which stays usable.
CONFLICT = {"40001": "serialization_failure", "40P01": "deadlock"}
CONNECTION = "connection_lost"
UNCLASSIFIED = "unclassified"


@dataclass
class Backoff:
    """Exponential backoff with full jitter: the n-th wait is uniform in [base, min(cap, base * 2**n)]."""

    base: float = 0.1
    cap: float = 2.0
    attempt: int = 0

    def next(self) -> float:
        ceiling = capped_backoff(self.base, self.attempt, self.cap)
        self.attempt += 1
        return random.uniform(self.base, max(self.base, ceiling))


def classify(error: BaseException) -> str:
    """What ``error`` says about the database: a ``REFUSING`` or ``CONFLICT`` reason, ``CONNECTION`` or
    ``UNCLASSIFIED``."""
    code = sqlstate(error)
    if code in REFUSING:
        return REFUSING[code]
    if code in CONFLICT:
        return CONFLICT[code]
    if isinstance(error, CONNECTION_LOST):
        return CONNECTION
    return UNCLASSIFIED


def server_gone(reason: str) -> bool:
    """Whether ``reason`` (``classify``) says the server's sessions went bad together, not just ours."""
    return reason == CONNECTION or reason in REFUSING.values()


def noted(error: BaseException, *, where: str) -> str:
    """Log and count ``error`` met in ``where`` (claim, slot, heartbeat: a bounded set); return its reason."""
    reason = classify(error)
    metrics.database_error(reason, where)  # durable_worker_database_errors_total
    if reason == UNCLASSIFIED:
        log.error("database error in %s (SQLSTATE %s); backing off", where, sqlstate(error), exc_info=error)
    else:
        log.warning("database error in %s: %s (SQLSTATE %s, %s: %s); backing off, retrying",
                    where, reason, sqlstate(error), type(error).__name__, error)  # fmt: skip
    return reason


def drop_connections(*, pool: bool = True) -> None:
    """Close every database connection of this thread, broken or not, and (``pool``) the idle sessions of
    the process's pool (those in use end when given back); the next query opens a new one."""
    for conn in connections.all(initialized_only=True):
        # Closing a dead socket may complain; the wrapper forgets the connection either way.
        with contextlib.suppress(DatabaseError):
            conn.close()
    if pool:
        with contextlib.suppress(DatabaseError):
            db.drain_pool()


def takes_writes() -> bool:
    """Whether this thread's session may write (a session opened while the server refused may not)."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT current_setting('transaction_read_only') = 'off'")
        row = cursor.fetchone()
    return bool(row and row[0])


def recover(
    worker_id: str,
    error: Exception,
    *,
    task_id: UUID | str | None = None,
    stopping: Callable[[], bool] = lambda: False,
    give_up_after: float | None = None,
    release: bool = True,
    where: str = "claim",
    backoff: Backoff | None = None,
) -> bool:
    """After ``error`` (any exception; see ``classify``): wait until PostgreSQL answers and takes
    writes, then release leftover leases.

    Releases every live lease of ``worker_id`` (only ``task_id``'s when given: a
    process running several tasks at once must not give up its siblings'; none
    with ``release=False``: the caller held none, e.g. a loop whose slots hold them).
    ``backoff``: the caller's, to keep growing the waits over repeated errors.
    Returns False, without having reached the database, if ``stopping()`` turned
    true or ``give_up_after`` seconds passed first.
    """
    gone = server_gone(noted(error, where=where))
    started = time.monotonic()
    backoff = backoff or Backoff()
    while True:
        drop_connections(pool=gone)
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
                if not takes_writes():
                    log.info("database still read-only")
                    continue
        except Exception as still_down:  # refusing or not, the next try may do
            reason = classify(still_down)
            gone = gone or server_gone(reason)
            log.info("database still unavailable (%s)", reason)
            continue
        log.warning(
            "database back (writable) after %.1fs; released %d lease(s) held when it went away",
            time.monotonic() - started,
            released,
        )
        return True
