"""Read-only pages read from a streaming replica (``DATABASE_REPLICA_URL``), with read-your-writes.

Opt-in: with ``DATABASE_REPLICA_URL`` empty there is no ``replica`` alias and
nothing here routes anything. When it is set, three parts decide where a query
goes:

- ``ReplicaReadsMiddleware`` marks a request as one that may read from the
  replica: a GET or HEAD to one of ``REPLICA_VIEWS`` (the heavy read pages of
  the console and the API). At its first read the router would send there, the
  page (``Page``) asks the replica once what it has replayed and how far behind
  it is, and reads it only if it answers, lags at most
  ``DATABASE_REPLICA_MAX_LAG`` seconds and has replayed the caller's last
  write (known then: the API authenticates its token in the view). Otherwise
  the page reads the primary: a missing, lagging or promoted replica is never
  an error page, and one failing mid-page has the page read again on the
  primary. The response says where the page read (``X-Read-From: replica`` or
  ``primary; reason``, with ``X-Replica-Lag``).
- ``ReplicaRouter`` sends a read to the replica only inside such a marked
  request, only for the models of ``REPLICA_APPS`` (tasks, audit, approvals,
  ledger: never sessions, users, memberships or permissions, which decide who
  may see what), never inside a transaction on the primary, and never for a
  relation followed from a row read on the primary. Every write,
  every ``select_for_update`` (Django routes those as writes) and every query of
  a worker, a transition, an approval's decision or a liveness check goes to
  the primary: none of them runs in a marked request. Migrations never run on
  the replica.
- Read-your-writes: after a request that may have written (any method but GET,
  HEAD, OPTIONS, TRACE), the middleware reads the primary's WAL position
  (``pg_current_wal_lsn()``, after the commit) and keeps it in the caller's
  session and, for callers without one (API tokens), in the cache under their
  user id (shared between processes when ``CACHE_URL`` is). A later page uses
  the replica only once its ``pg_last_wal_replay_lsn()`` has reached it.

Raw SQL through ``django.db.connection`` (the queue's capped counts) is not
routed: it reads the primary.
"""

from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

REPLICA = "replica"  # the DATABASES alias of the replica
# The apps whose rows a read-only page may read slightly stale. Not sessions, auth, tenancy, guardian,
# otp, axes or console (saved views, preferences): who may see what is always read on the primary.
REPLICA_APPS = frozenset({"tasks", "audit", "approvals", "ledger"})
# The read-only pages that read from the replica (URL names, GET and HEAD only): the heavy lists,
# searches, histories and the dashboard. Their POST siblings (controls, decisions) are other URLs.
REPLICA_VIEWS = frozenset({
    "console:queue", "console:queue-export", "console:task", "console:dashboard",
    "console:audit", "console:audit-export", "console:audit-task", "console:audit-task-export",
    "console:failed", "console:quarantine",
    "api-tasks", "api-task", "api-task-events", "api-task-checkpoints",
})  # fmt: skip
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})  # requests that never write
SESSION_KEY = "_replica_lsn"  # the primary's WAL position after the caller's last write
CACHE_PREFIX = "replica-lsn:user:"
CACHE_SECONDS = 600  # a replica this far behind is past any DATABASE_REPLICA_MAX_LAG worth setting
CONNECT_TIMEOUT = 2  # seconds: a replica that drops packets must not hold a page for the kernel's minutes
RETRY_AFTER = 10.0  # seconds a process leaves an unreachable replica alone before asking it again

# The read-only page being served, while its view runs (set by the middleware); None everywhere else.
_page: contextvars.ContextVar[Page | None] = contextvars.ContextVar("replica_page", default=None)
_down_until = 0.0  # time.monotonic() before which this process does not try the replica


# --- WAL positions ------------------------------------------------------------------------------


def lsn(text: str) -> int:
    """A PostgreSQL LSN (``16/B374D848``: two hexadecimal halves) as one comparable number."""
    high, sep, low = text.strip().partition("/")
    try:
        if not sep or not high or not low:
            raise ValueError(text)
        return (int(high, 16) << 32) | int(low, 16)
    except ValueError:
        raise ValueError(f"not a WAL position (LSN): {text!r}") from None


def lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


# --- configuration ------------------------------------------------------------------------------


def configured() -> bool:
    return REPLICA in settings.DATABASES


def replica_settings(
    primary: dict[str, Any], replica: dict[str, Any], pooler: str, url: str = ""
) -> dict[str, Any]:
    """The ``replica`` alias of ``DATABASES``: ``replica`` (parsed from ``DATABASE_REPLICA_URL``,
    ``url``) with the primary's per-connection settings, a short connect timeout, its sessions
    read-only, and no database of its own in tests (a mirror of ``default``). Several standbys in
    ``url``: libpq prefers one that is a standby (``target_session_attrs=prefer-standby``) unless
    the URL says otherwise."""
    if replica.get("ENGINE") != "django.db.backends.postgresql" or primary.get("ENGINE") != replica["ENGINE"]:
        raise ImproperlyConfigured(
            "DATABASE_REPLICA_URL: the primary (DATABASE_URL) and the replica must both be PostgreSQL "
            "(a streaming standby: the pages compare WAL positions)"
        )
    config = {**replica}
    for field in ("CONN_MAX_AGE", "CONN_HEALTH_CHECKS", "ATOMIC_REQUESTS", "TIME_ZONE"):
        if field in primary:
            config.setdefault(field, primary[field])
    options = config.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", CONNECT_TIMEOUT)
    if "," in str(config.get("HOST", "")) and "target_session_attrs" not in urlsplit(url).query:
        options["target_session_attrs"] = "prefer-standby"  # not the writer's read-write default
    if pooler == "none":  # a transaction pooler refuses startup options
        options.setdefault("options", "-c default_transaction_read_only=on")
    config["TEST"] = {"MIRROR": DEFAULT_DB_ALIAS}  # tests never create or migrate a replica database
    return config


def max_lag() -> float:
    return float(settings.DATABASE_REPLICA_MAX_LAG)


# --- the router ---------------------------------------------------------------------------------


class ReplicaRouter:
    """Reads of ``REPLICA_APPS`` in a request marked by the middleware go to the replica, once the page has
    found it fit to read; all else, and every write, to the primary."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        page = _page.get()
        if (
            page is not None
            and model._meta.app_label in REPLICA_APPS
            and not connections[DEFAULT_DB_ALIAS].in_atomic_block
            and _from_replica(hints.get("instance"))
            and page.reads_replica()
        ):
            return REPLICA
        return DEFAULT_DB_ALIAS  # explicit: a row read on the replica does not pull its relations there

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        return DEFAULT_DB_ALIAS

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        both = {obj1._state.db, obj2._state.db}
        return True if both <= {DEFAULT_DB_ALIAS, REPLICA, None} else None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        return False if db == REPLICA else None


def _from_replica(instance: Any) -> bool:
    """A relation followed from a row read on the primary (a decision's request, a locked task) is read
    on the primary too: no mix of fresh and stale rows in one check."""
    return instance is None or getattr(getattr(instance, "_state", None), "db", None) != DEFAULT_DB_ALIAS


# --- the decision -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    replayed: int | None  # pg_last_wal_replay_lsn(); None: not a standby (promoted, or a primary)
    lag: float | None  # seconds behind the primary; None: unknown


def choose(state: ReplicaState | None, required: int | None, limit: float) -> tuple[bool, str]:
    """Whether a page may read the replica in ``state``, for a caller who needs position ``required``
    (their last write; None: none), with at most ``limit`` seconds of lag; and why not."""
    if state is None:
        return False, "replica unavailable"
    if state.replayed is None:
        return False, "replica is not a standby"
    if state.lag is None or state.lag > limit:
        return False, "replica lags"
    if required is not None and state.replayed < required:
        return False, "replica behind your write"
    return True, ""


# On the standby: what it replayed, and how far behind it is. Caught up with what it received: no lag;
# otherwise the age of the last transaction it replayed (NULL before any: unknown, too far).
PROBE = """
SELECT pg_last_wal_replay_lsn()::text,
       CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp()) END
"""


def probe() -> ReplicaState | None:
    """The replica's state, or None when it does not answer (then not asked for ``RETRY_AFTER`` s)."""
    global _down_until
    if time.monotonic() < _down_until:
        return None
    try:
        with connections[REPLICA].cursor() as cursor:
            cursor.execute(PROBE)
            replayed, lag = cursor.fetchone()
    except DatabaseError as exc:
        _replica_failed(exc)
        return None
    return ReplicaState(lsn(replayed) if replayed else None, None if lag is None else float(lag))


def _replica_failed(exc: BaseException) -> None:
    global _down_until
    _down_until = time.monotonic() + RETRY_AFTER
    log.warning("replica unavailable, pages read the primary for %ss: %s", RETRY_AFTER, exc)
    try:
        connections[REPLICA].close()
    except DatabaseError:
        pass


def primary_position() -> int:
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_lsn()::text")
        return lsn(cursor.fetchone()[0])


# --- the page and the middleware ----------------------------------------------------------------


def _user_id(request: HttpRequest) -> int | None:
    user = getattr(request, "user", None)
    return user.pk if user is not None and user.is_authenticated else None


def required_position(request: HttpRequest) -> int | None:
    """The WAL position this caller's last write reached, from the session or the cache."""
    found = []
    session = getattr(request, "session", None)
    if session is not None and session.get(SESSION_KEY):
        found.append(lsn(session[SESSION_KEY]))
    user_id = _user_id(request)
    if user_id is not None and (cached := cache.get(f"{CACHE_PREFIX}{user_id}")):
        found.append(lsn(cached))
    return max(found, default=None)


def remember_position(request: HttpRequest, position: int) -> None:
    """After ``request`` wrote: its caller's next pages wait for the replica to replay ``position``."""
    user_id = _user_id(request)
    if user_id is None:
        return
    text = lsn_text(position)
    session = getattr(request, "session", None)
    if session is not None:
        session[SESSION_KEY] = text
    cache.set(f"{CACHE_PREFIX}{user_id}", text, CACHE_SECONDS)


class Page:
    """A read-only page that may read the replica. Decided at its first routed read, not before: the API
    knows its caller only once the view has authenticated the token."""

    def __init__(self, request: HttpRequest | None, *, use: bool | None = None):
        self.request = request
        self.use = use  # None: not decided yet
        self.where = "replica" if use else ""
        self.lag: float | None = None

    def reads_replica(self) -> bool:
        if self.use is None:
            assert self.request is not None
            state = probe()
            self.use, reason = choose(state, required_position(self.request), max_lag())
            self.lag = state.lag if state is not None else None
            self.where = "replica" if self.use else f"primary; {reason}"
        return self.use

    def fall_back(self, why: str) -> None:
        self.use, self.where = False, f"primary; {why}"


class ReplicaReadsMiddleware:
    """After the session and authentication middleware: marks the read-only pages that may read the
    replica, says where each read (``X-Read-From``, ``X-Replica-Lag``), and remembers where each
    caller's writes reached on the primary."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not configured():
            return self.get_response(request)
        request._replica_page = None  # type: ignore[attr-defined]
        try:
            response = self.get_response(request)
        finally:
            token = getattr(request, "_replica_token", None)
            if token is not None:
                _page.reset(token)
        if request.method not in READ_METHODS and _user_id(request) is not None:
            self._remember(request)
        page: Page | None = request._replica_page  # type: ignore[attr-defined]
        if page is not None and page.use is not None:
            response["X-Read-From"] = page.where
            if page.lag is not None:
                response["X-Replica-Lag"] = f"{page.lag:.3f}"
        return response

    def process_view(self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any) -> None:
        match = request.resolver_match
        if (
            configured()
            and request.method in ("GET", "HEAD")
            and match is not None
            and match.view_name in REPLICA_VIEWS
        ):
            page = request._replica_page = Page(request)  # type: ignore[attr-defined]
            request._replica_token = _page.set(page)  # type: ignore[attr-defined]
        return None

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """The replica failed mid-page: the page is read again on the primary (it only reads)."""
        page: Page | None = getattr(request, "_replica_page", None)
        if page is None or not page.use or not isinstance(exception, DatabaseError):
            return None
        if isinstance(exception, OperationalError | InterfaceError):
            _replica_failed(exception)  # gone: left alone for a while
        else:  # a query cancelled by the standby's recovery, say: this page only
            connections[REPLICA].close()
        page.fall_back("replica failed")
        match = request.resolver_match
        assert match is not None
        response: HttpResponse = match.func(request, *match.args, **match.kwargs)
        render = getattr(response, "render", None)
        return render() if callable(render) else response

    def _remember(self, request: HttpRequest) -> None:
        if connections[DEFAULT_DB_ALIAS].in_atomic_block:
            return  # not committed yet: nothing to read back
        try:
            remember_position(request, primary_position())
        except DatabaseError as exc:  # the primary is gone: the next page reads it anyway, or fails there
            log.warning("could not read the primary's WAL position after a write: %s", exc)
