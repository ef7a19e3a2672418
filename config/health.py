"""Health for load balancers and orchestrators: `/healthz` (the process answers), `/readyz` (it can serve).

Answered by ``HealthMiddleware``, near the top of ``MIDDLEWARE``, before the
rest of the stack, on purpose:

- before host validation: a probe addresses an instance or a pod by its IP
  (Kubernetes sends ``Host: <pod ip>:<port>``), which ``ALLOWED_HOSTS`` rightly
  does not list, so through the URL conf every probe would be a 400;
- before the HTTPS redirect: a load balancer probes over plain HTTP inside its
  network, and a 301 to https is a failed check for most of them;
- before sessions, the access log and the rest: a probe every few seconds
  should cost a function call (``/healthz``) or two round trips (``/readyz``).

Nothing in an answer comes from the request (no host, header or path is
echoed), so skipping those checks cannot poison it, and nothing in it is
secret: the name of each check and "ok" or a fixed word for what failed. The
detail goes to the log.

``/readyz`` is 200 only when the database answers ``SELECT 1`` within a
second, every migration is applied (a positive answer is kept: migrations
are not unapplied under a running process), and the broker accepts a
connection within a second when ``CELERY_BROKER_URL`` names a server (the
embedded file and memory transports have none to reach). The whole answer is
kept for ``READY_TTL`` seconds, so a flood of probes costs one check a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

DATABASE_TIMEOUT_MS = 1000
BROKER_TIMEOUT = 1  # seconds (kombu takes whole ones)
READY_TTL = 1.0
EMBEDDED_BROKERS = ("filesystem", "memory")

_lock = threading.Lock()
_migrated = False
_last: tuple[float, int, bytes] | None = None  # (monotonic time, status, body) of the latest /readyz


def check_database() -> str:
    """Either ok, or unreachable when the database does not answer ``SELECT 1`` within a second."""
    connection = connections[DEFAULT_DB_ALIAS]
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"SET LOCAL statement_timeout = {DATABASE_TIMEOUT_MS}")
            cursor.execute("SELECT 1")
    except DatabaseError:
        log.warning("readyz: the database does not answer", exc_info=True)
        return "unreachable"
    return "ok"


def migration_plan() -> list[object]:
    """The migrations the database still lacks (empty when it is up to date)."""
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    return list(executor.migration_plan(executor.loader.graph.leaf_nodes()))


def check_migrations(plan: Callable[[], list[object]] = migration_plan) -> str:
    """Either ok, or pending while a migration is not applied (the positive answer is kept for good)."""
    global _migrated
    if _migrated:
        return "ok"
    try:
        missing = plan()
    except DatabaseError:
        log.warning("readyz: could not read the applied migrations", exc_info=True)
        return "unreachable"
    if missing:
        log.warning("readyz: %d migrations not applied", len(missing))
        return "pending"
    _migrated = True
    return "ok"


def check_broker() -> str:
    """Either ok, skipped for the embedded transports, or unreachable (no connection within a second)."""
    url = settings.CELERY_BROKER_URL
    if url.partition("://")[0] in EMBEDDED_BROKERS:
        return "skipped"
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=BROKER_TIMEOUT) as broker:
            broker.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=BROKER_TIMEOUT)
    except Exception:  # kombu raises per transport; any failure to connect is "not reachable"
        log.warning("readyz: the broker does not answer", exc_info=True)
        return "unreachable"
    return "ok"


def readiness() -> tuple[int, dict[str, object]]:
    """(HTTP status, body) of ``/readyz``: every check by name; 503 unless each is ok (or skipped)."""
    database = check_database()
    checks = {
        "database": database,
        "migrations": check_migrations() if database == "ok" else "not checked",
        "broker": check_broker(),
    }
    ready = all(result in ("ok", "skipped") for result in checks.values())
    return (200 if ready else 503), {"status": "ready" if ready else "not ready", "checks": checks}


def _json(status: int, body: dict[str, object] | bytes) -> HttpResponse:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = HttpResponse(content, status=status, content_type="application/json")
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    """The process is up and answering: no database, no broker."""
    return _json(200, {"status": "ok", "checks": {"process": "ok"}})


def readyz(request: HttpRequest) -> HttpResponse:
    global _last
    with _lock:  # probes arriving together share one check
        now = time.monotonic()
        if _last is None or now - _last[0] >= READY_TTL:
            status, body = readiness()
            _last = (now, status, json.dumps(body).encode())
        _, status, content = _last
    return _json(status, content)


ROUTES: dict[str, Callable[[HttpRequest], HttpResponse]] = {"/healthz": healthz, "/readyz": readyz}


class HealthMiddleware:
    """Answers ``GET``/``HEAD`` ``/healthz`` and ``/readyz`` itself; every other request goes on."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        view = ROUTES.get(request.path_info.rstrip("/") or "/")
        if view is None:
            return self.get_response(request)
        if request.method not in ("GET", "HEAD"):
            response = _json(405, {"status": "method not allowed"})
            response["Allow"] = "GET, HEAD"
            return response
        return view(request)


def forget() -> None:
    """Drop what this process remembers (the kept migration answer and the last /readyz): for tests."""
    global _migrated, _last
    with _lock:
        _migrated, _last = False, None
