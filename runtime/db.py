"""Database connections for a process with many tasks in flight: a bounded pool, held only while in use.

``use_pool(size)`` (PostgreSQL) makes every thread's connection come from one
psycopg pool of at most ``size`` connections: closing a thread's connection
gives it back instead of ending the session. ``released()`` wraps a wait on
the outside world (a model turn, an evidence read, a send): the thread's
connection goes back to the pool for the duration, unless a transaction is
open, so a slot waiting on a model holds no database session. Without a pool
(SQLite, the Celery prefork worker) both do nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connections

APPLICATION_NAME = "durable-worker"  # how the pool's sessions show in pg_stat_activity
POOL_TIMEOUT = 30.0  # seconds a thread waits for a free connection before its step fails (and is retried)


def use_pool(size: int) -> bool:
    """Serve this process's connections from a pool of at most ``size``; call before any query.

    Returns False (and changes nothing) when the database is not PostgreSQL.
    """
    conn = connections["default"]
    if conn.vendor != "postgresql":
        return False
    conn.close()  # a connection opened before (system checks) would bypass the pool
    options = conn.settings_dict["OPTIONS"]
    options["pool"] = {"min_size": 1, "max_size": size, "timeout": POOL_TIMEOUT}
    options.setdefault("application_name", APPLICATION_NAME)
    return True


def pooled() -> bool:
    return bool(connections["default"].settings_dict["OPTIONS"].get("pool"))


@contextmanager
def released() -> Iterator[None]:
    """Give this thread's pooled connection back while the block waits on something else."""
    conn = connections["default"]
    if pooled() and conn.connection is not None and not conn.in_atomic_block:
        conn.close()
    yield


def drain_pool() -> None:
    """End every idle session of this process's pool (one in use ends when given back); new ones replace them.

    For a server whose sessions went bad together: terminated by a failover, or
    opened while it was read-only — a session keeps the read-only default it
    started with after the server takes writes again.
    """
    pool = getattr(connections["default"], "pool", None) if pooled() else None  # PostgreSQL's wrapper only
    if pool is not None:
        pool.drain()
