"""A request that meets a database outage answers 503 with ``Retry-After``, never a 500.

During a PostgreSQL failover, a restart or a shutdown, a request's query fails:
the connection was cut (``57P01``), no server answers yet (``OperationalError``
on connect), or the address still leads to the old primary, now read-only
(``25006``, an ``InternalError`` for psycopg). None of these is the request's
fault nor a bug: the caller should try again in a few seconds, when the
multi-host ``DATABASE_URL`` (``target_session_attrs=read-write``) leads a new
connection to the new primary. ``REFUSING`` (by SQLSTATE) is the one list of
such server states; the workers' reconnect path (``runtime.reconnect``) reads
it too.

Two places turn the error into the answer, so that it is caught wherever it is
raised:

- ``DatabaseOutageMiddleware.process_exception``: raised by a view (an API
  view re-raises what DRF's handler does not know);
- ``server_error`` (``handler500``): raised by a middleware before the view —
  loading the session, the signed-in user, the second factor — which Django
  turns into its 500 page before any outer middleware could see it.

Either way the request's connections are closed, so that the next request opens
a fresh session (a session opened on a read-only server stays read-only) and no
transaction is left half done: what the request wrote before the error was
rolled back with its transaction, or never reached the server.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

log = logging.getLogger(__name__)

# "This server cannot take our work now", by SQLSTATE, whatever error class psycopg gives it.
REFUSING = {
    "25006": "read_only",  # read_only_sql_transaction: a demoted primary, a reader, a paused writer
    "57P01": "admin_shutdown",  # our session was terminated (a failover's, or an operator's)
    "57P02": "crash_shutdown",
    "57P03": "cannot_connect_now",  # starting up, shutting down, or in recovery (a standby)
    "53300": "too_many_connections",
}
CONNECTION_LOST = "connection_lost"
RETRY_AFTER = 5  # seconds: a pg_auto_failover or Patroni promotion takes a few to a few tens
CODE = "database_unavailable"
DETAIL = "The database is unavailable (a failover or restart); try again shortly."
A2A_PATH = "/a2a/"


def sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a database error (Django wraps psycopg's, which carries it), or None."""
    seen: BaseException | None = error
    while seen is not None:
        code = getattr(seen, "sqlstate", None)
        if code:
            return str(code)
        seen = seen.__cause__
    return None


def outage_reason(error: BaseException) -> str | None:
    """Why ``error`` means the database is unavailable (a ``REFUSING`` reason or ``CONNECTION_LOST``),
    or None when it is anything else (a data error, a bug: those stay 500s)."""
    code = sqlstate(error)
    if code in REFUSING:
        return REFUSING[code]
    if code is not None and code.startswith("08"):  # class 08, connection exception
        return CONNECTION_LOST
    if code is None and isinstance(error, OperationalError | InterfaceError):
        return CONNECTION_LOST
    return None


def close_connections() -> None:
    for conn in connections.all(initialized_only=True):
        with contextlib.suppress(DatabaseError):  # closing a dead socket may complain
            conn.close()


def jsonrpc_error(reason: str) -> dict[str, object]:
    """The JSON-RPC error object an A2A caller gets: internal error (-32603) with one
    ``google.rpc.ErrorInfo`` whose metadata says the database is unavailable and why (the shape of
    ``a2a_api.rpc.RpcError.as_error``, which a test holds this to)."""
    info = {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo",
        "reason": "INTERNAL_ERROR",
        "domain": "a2a-protocol.org",
        "metadata": {"code": CODE, "reason": reason},
    }
    return {"code": -32603, "message": DETAIL, "data": [info]}


def unavailable(request: HttpRequest, reason: str, *, rpc_id: object = None) -> HttpResponse:
    """The 503: a JSON-RPC error on the A2A endpoint (``rpc_id`` is the request's id when known), JSON
    for API and machine callers, a short page for a browser."""
    close_connections()
    log.warning("database unavailable during %s %s (%s): answered 503", request.method, request.path, reason)
    response: HttpResponse
    if request.path.startswith(A2A_PATH):
        response = JsonResponse({"jsonrpc": "2.0", "id": rpc_id, "error": jsonrpc_error(reason)}, status=503)
    elif "text/html" in request.headers.get("Accept", "") and not request.path.startswith("/api/"):
        response = HttpResponse(
            f"<!doctype html><title>Unavailable</title><h1>Service unavailable</h1><p>{DETAIL}</p>",
            status=503,
        )
    else:
        response = JsonResponse({"detail": DETAIL, "code": CODE, "reason": reason}, status=503)
    response["Retry-After"] = str(RETRY_AFTER)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseOutageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        reason = outage_reason(exception)
        return unavailable(request, reason) if reason else None


def server_error(request: HttpRequest) -> HttpResponse:
    """``handler500``: the 503 when the error being handled is an outage, Django's 500 page otherwise.

    Django calls it while handling the exception (``sys.exc_info()`` names it)."""
    error = sys.exc_info()[1]
    reason = outage_reason(error) if error is not None else None
    if reason:
        return unavailable(request, reason)
    return defaults.server_error(request)
