"""Worker liveness the database itself can see: one session-level advisory lock per worker process.

A lease's TTL is how long others wait for a worker that stopped heartbeating.
For the commonest failure — the process died (SIGKILL, OOM, a crashed pod) —
that wait is unnecessary: the kernel closes the dead process's sockets, its
PostgreSQL session ends, and every lock the session held is released at once.
So each worker process holds ``pg_advisory_lock(key)`` on a connection of its
own, for as long as it lives, and stamps ``key`` on every lease it takes
(``Lease.holder_key``). A claimer treats a live lease whose holder's lock is
gone (not in ``pg_locks``) as lapsed: the task is claimable at once, and the
takeover bumps the token, so fencing is exactly as strict as with the TTL.

A worker that is paused (SIGSTOP, a long GC, a VM freeze) keeps its connection
and its lock: its leases lapse by TTL as before, and its late writes are
fenced by the token. A machine that vanishes without closing its sockets is
noticed by TCP keepalives (set on the liveness connection) or, at the latest,
by the TTL. SQLite (the embedded demo) has no advisory locks: leases carry no
key and lapse by TTL only. Behind a transaction-pooling proxy (PgBouncer in
``transaction`` mode) a session lock through the proxy would stay on a pooled
server session after its worker died: the lock's connection goes straight to
PostgreSQL instead, at ``DATABASE_LIVENESS_URL`` (``config.dsn``); the check of
``pg_locks`` may go through the proxy (it sees every session's locks).

The same connection measures the worker's clock against the database's, when
the lock is taken and on every heartbeat (``healthy``): ``SELECT
clock_timestamp()`` against the local time halfway through the round trip.
Leases are timed by the database's clock alone (``tasks.leases``), but the
worker writes other times from its own (deadlines, audit times); so while the
two differ by more than ``WORKER_MAX_CLOCK_SKEW`` seconds the process claims
nothing (``claims_refused``), says so in its log, and shows the skew as the
``durable_worker_clock_skew_seconds`` gauge.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import OperationalError, connections

from tasks import metrics

log = logging.getLogger(__name__)

# pg_advisory_lock(bigint) shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
HELD_KEYS_SQL = (
    "SELECT (l.classid::bigint << 32) | l.objid::bigint FROM pg_locks l "
    "WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
)
APPLICATION_NAME = "durable-worker-liveness"  # how the lock's session shows in pg_stat_activity
_KEEPALIVE = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3}

_lock = threading.Lock()
_key: int | None = None
_conn: psycopg.Connection[Any] | None = None
_pid: int | None = None
_inherited: list[object] = []  # connections a forked child must neither use nor close: kept, never touched
_skew: tuple[int, float] | None = None  # (pid, seconds this clock is ahead of the database's), last measured
CLOCK_SQL = "SELECT clock_timestamp()"  # the database's time as it answers, not its transaction's start


def supported() -> bool:
    return connections["default"].vendor == "postgresql" and bool(getattr(settings, "WORKER_LIVENESS", True))


def _connect_params() -> dict[str, Any]:
    """The default database's connection parameters, at ``DATABASE_LIVENESS_URL`` when it is set."""
    default = connections["default"]
    direct = getattr(settings, "DATABASE_LIVENESS", None)
    source = default if not direct else type(default)({**default.settings_dict, **direct}, "liveness")
    params = dict(source.get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    return {**params, **_KEEPALIVE, "autocommit": True, "application_name": APPLICATION_NAME}


def key() -> int | None:
    """This process's liveness key while it holds the lock (None: its leases lapse by TTL only)."""
    return _key if _pid == os.getpid() and _conn is not None else None


def ensure() -> int | None:
    """Hold this process's liveness lock, (re)connecting if needed; return its key.

    Raises Django's ``OperationalError`` when the database cannot be reached.

    Cheap when the lock is held. After a fork the child takes a lock of its own
    (the parent's connection is left alone: closing it would end the parent's
    session). A connection lost with the database is reopened with the same key,
    so the leases stamped with it count as alive again; any that another worker
    took meanwhile carry a newer token, which fences this worker off them.
    """
    global _key, _conn, _pid
    if not supported():
        measure_skew()  # on the Django connection: the clock is checked at start all the same
        return None
    with _lock:
        if _pid != os.getpid():
            if _conn is not None:
                _inherited.append(_conn)
            _key, _conn, _pid = secrets.randbits(62) + 1, None, os.getpid()
        if _conn is not None and not _conn.closed and not _conn.broken:
            return _key
        try:
            conn = psycopg.connect(**_connect_params())
            conn.execute("SELECT pg_advisory_lock(%s)", (_key,))
            _measure(lambda: _database_time(conn))
        except psycopg.Error as exc:  # as Django's own connections report it, so callers handle one kind
            raise OperationalError(f"liveness lock: {exc}") from exc
        _conn = conn
        log.info("worker liveness lock %s held", _key)
        return _key


def healthy() -> bool:
    """Whether the liveness connection answers (a round trip, which measures the clock's skew too);
    False means ``ensure`` must reconnect."""
    with _lock:
        conn = _conn if _pid == os.getpid() else None
        if conn is not None:
            try:
                _measure(lambda: _database_time(conn))
            except psycopg.Error:
                return False
            return True
        if supported():
            return False
    # No liveness connection by design (SQLite, WORKER_LIVENESS=0): the clock is measured on Django's.
    with contextlib.suppress(OperationalError):  # the beat that follows finds the database away itself
        measure_skew()
    return True


def _database_time(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute(CLOCK_SQL).fetchone()
    assert row is not None
    found: datetime = row[0]
    return found


def _django_database_time() -> datetime:
    with connections["default"].cursor() as cursor:
        cursor.execute(CLOCK_SQL)
        found: datetime = cursor.fetchone()[0]
    return found


def _measure(database_time: Callable[[], datetime], clock: Callable[[], float] = time.time) -> float:
    """This clock minus the database's (seconds), read halfway through one round trip; kept and shown."""
    global _skew
    began, local = time.monotonic(), clock()
    remote = database_time()
    skew = local + (time.monotonic() - began) / 2 - remote.timestamp()
    was = claims_refused()
    _skew = (os.getpid(), skew)
    metrics.clock_skew(skew)
    refusal = claims_refused()
    if refusal is not None:
        log.warning("%s", refusal)  # on every measurement while it lasts: the log says why nothing moves
    elif was is not None:
        log.warning("clock skew %+.3f s against the database, within WORKER_MAX_CLOCK_SKEW: claiming", skew)
    return skew


def measure_skew(*, clock: Callable[[], float] = time.time) -> float:
    """Measure this process's clock (``clock``) against the database's now, on the liveness connection
    if it is held, else on the thread's Django connection; return the skew (positive: this clock is ahead).

    On SQLite (the demo) the database's clock is this machine's: nothing to measure, 0.
    Raises Django's ``OperationalError`` when the database cannot be reached.
    """
    with _lock:
        conn = _conn if _pid == os.getpid() else None
        if conn is not None and not conn.closed and not conn.broken:
            try:
                return _measure(lambda: _database_time(conn), clock)
            except psycopg.Error as exc:
                raise OperationalError(f"liveness clock: {exc}") from exc
    if connections["default"].vendor != "postgresql":
        return 0.0
    return _measure(_django_database_time, clock)


def claims_refused() -> str | None:
    """Why this process must claim nothing now, in words: its last measured clock skew is beyond
    ``WORKER_MAX_CLOCK_SKEW``. None: it may claim (within the limit, or not measured in this process)."""
    measured = _skew if _skew is not None and _skew[0] == os.getpid() else None
    limit = float(settings.WORKER_MAX_CLOCK_SKEW)
    if measured is None or abs(measured[1]) <= limit:
        return None
    return (
        f"refusing to claim tasks: this worker's clock is {measured[1]:+.1f} s off the database's, beyond "
        f"WORKER_MAX_CLOCK_SKEW={limit:g} s; set its clock right (NTP), it claims again at its next heartbeat"
    )


def forget_skew() -> None:
    """Forget the last measurement (tests): the process claims as if it had never measured."""
    global _skew
    _skew = None


def stop() -> None:
    """Release the lock (the process is about to exit cleanly, its leases already given back).

    Leases taken after this carry no key (TTL only) until ``ensure`` takes a new lock.
    """
    global _conn, _pid
    with _lock:
        if _conn is not None and _pid == os.getpid():
            with contextlib.suppress(psycopg.Error):
                _conn.close()
        _conn, _pid = None, None
