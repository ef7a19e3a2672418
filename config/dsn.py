"""``DATABASE_URL`` naming several PostgreSQL servers: the writer among them is found by libpq.

A highly available cluster (pg_auto_failover, Patroni) is reached through every
node's address, the writer chosen at connect time::

    postgres://app@db1:5432,db2:5432,db3/app?target_session_attrs=read-write

libpq tries the hosts in order and keeps the first session that takes writes;
after a failover, a new connection finds the new primary. django-environ parses
the host list but gives it one port when only some hosts name theirs (``db3``
would be dialled on ``db1``'s port) and keeps an IPv6 address's brackets, which
libpq refuses. ``database_settings`` parses the list itself, host by host, into
the comma-separated ``HOST`` and ``PORT`` Django hands to psycopg, and for a
list of hosts:

- ``target_session_attrs`` defaults to ``read-write`` (this app writes on every
  path: a session on a standby would refuse the first write), and a value libpq
  does not know is refused at start-up, not at every request;
- ``connect_timeout`` defaults to ``CONNECT_TIMEOUT`` seconds, per host: a host
  that drops packets must not hold each new connection for the kernel's minutes.

A URL with one host is django-environ's, unchanged.

Behind a transaction-pooling proxy (PgBouncer with ``pool_mode = transaction``)
consecutive transactions of one Django connection may run on different server
sessions, so nothing may outlive a transaction. ``DATABASE_POOLER=transaction``
(``pooled``) turns off server-side cursors (``QuerySet.iterator()`` would
declare a cursor in one session and fetch from another) and pins prepared
statements off (``prepare_threshold`` None, which a URL cannot spell). Without
it, ``pooled`` turns them on (``PREPARE_THRESHOLD``; Django's default is off):
only the worker's hot statements use them, each prepared on its first run in a
session (``tasks.hotpath.hot_cursor``). The one session-level object the app
keeps, each worker's liveness lock (``tasks.liveness``), needs a session of its
own straight to PostgreSQL: ``DATABASE_LIVENESS_URL`` (``liveness_settings``);
with the pooler in transaction mode and liveness on, start-up refuses to go on
without it (``require_direct_liveness``).

A peer that vanishes without closing its sockets (a network partition, a host
powered off) is invisible to TCP until it tries to send: without help a query
sent into a partition waits the kernel's retransmissions out (about 15 minutes),
and a server session whose client is gone stays — with its locks, the worker's
liveness lock among them — until the server's keepalives notice, two hours by
the operating system's defaults. ``detect_dead_peers`` bounds both on every
PostgreSQL connection: libpq's keepalives and ``tcp_user_timeout`` on our end
(``DEAD_PEER``), and, where the connection goes straight to PostgreSQL, the
same asked of the server for the session (``SERVER_DEAD_PEER``, through the
``options`` startup parameter; a transaction pooler would refuse it, so not
through one): a partitioned worker's sessions end, and its locks go, within
``DEAD_PEER_SECONDS``.

A pooler in session mode (PgBouncer with ``pool_mode = session``) gives each
client one server session for as long as it stays connected, so nothing the
app keeps in a session breaks; but PgBouncer refuses a client whose startup
packet carries ``options`` (``unsupported startup parameter: options``), and
with ``options`` in its ``ignore_startup_parameters`` it connects the client and
drops the settings silently (``tests/cluster/test_pooler_session.py``). Asked
through the pooler, the server would watch PgBouncer anyway, not the worker.
``DATABASE_POOLER=session`` changes nothing but that: the server is not asked
through the pooler (PgBouncer's own ``tcp_keep*`` settings, or a direct
``DATABASE_LIVENESS_URL``, watch the workers then).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql", "psql"}
DEFAULT_PORT = "5432"
POOLERS = ("none", "session", "transaction")  # DATABASE_POOLER: what sits between the app and PostgreSQL
# psycopg's own default. Django turns prepared statements off unless OPTIONS has a threshold; with one,
# only the hot statements (tasks.hotpath.hot_cursor) are prepared: Django's cursors bind on the client,
# and those never prepare, so the number itself matters to no statement here.
PREPARE_THRESHOLD = 5
SESSION_ATTRS = {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}
CONNECT_TIMEOUT = 5  # seconds per host
# Keepalive probes after 5 s of silence, every 2 s, 3 unanswered: a dead peer is given up after 11 s;
# data left unacknowledged 15 s (tcp_user_timeout, in ms) ends the connection too. Both ends alike.
DEAD_PEER = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
             "tcp_user_timeout": 15_000}  # fmt: skip
SERVER_DEAD_PEER = {"tcp_keepalives_idle": 5, "tcp_keepalives_interval": 2, "tcp_keepalives_count": 3,
                    "tcp_user_timeout": 15_000}  # fmt: skip
DEAD_PEER_SECONDS = 15  # the longer of the two bounds above


def _host_and_port(entry: str, url: str) -> tuple[str, str]:
    if entry.startswith("["):  # [IPv6] or [IPv6]:port
        host, _, rest = entry[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = entry.partition(":")
    if not host or (port and not port.isdigit()):
        raise ImproperlyConfigured(
            f"DATABASE_URL: cannot read host {entry!r} of the host list (in {_shown(url)})"
        )
    return unquote(host), port or DEFAULT_PORT


def _shown(url: str) -> str:
    """The URL without its password, for an error message."""
    parts = urlsplit(url)
    users, at, hosts = parts.netloc.rpartition("@")
    user = users.partition(":")[0]
    return parts._replace(netloc=f"{user}{at}{hosts}").geturl()


def database_settings(env: environ.Env, url: str) -> dict[str, Any]:
    """Django's ``DATABASES`` entry for ``url``; for several PostgreSQL hosts, see the module's docstring."""
    config: dict[str, Any] = env.db_url_config(url)
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    if parts.scheme not in POSTGRES_SCHEMES or "," not in hosts:
        return config
    pairs = [_host_and_port(entry, url) for entry in hosts.split(",")]
    config["HOST"] = ",".join(host for host, _ in pairs)
    config["PORT"] = ",".join(port for _, port in pairs)
    options = config.setdefault("OPTIONS", {})
    attrs = str(options.setdefault("target_session_attrs", "read-write"))
    if attrs not in SESSION_ATTRS:
        raise ImproperlyConfigured(
            f"DATABASE_URL: target_session_attrs={attrs!r} is not one libpq knows "
            f"({', '.join(sorted(SESSION_ATTRS))}); for the writer of a cluster use read-write"
        )
    options.setdefault("connect_timeout", CONNECT_TIMEOUT)
    return config


def pooled(config: dict[str, Any], pooler: str) -> dict[str, Any]:
    """``config`` (a ``DATABASES`` entry) made safe behind ``pooler`` (``DATABASE_POOLER``), in place.

    ``none``: a direct connection; prepared statements allowed (``prepare_threshold``
    ``PREPARE_THRESHOLD`` unless the URL gives one).
    ``session``: a pooler in session mode; the same (the caller asks the server for no
    ``detect_dead_peers`` settings: ``server=False``).
    ``transaction``: no server-side cursors, no prepared statements (``prepare_threshold`` None).
    Not PostgreSQL: unchanged.
    """
    if pooler not in POOLERS:
        raise ImproperlyConfigured(
            f"DATABASE_POOLER: {pooler!r} is not one of {', '.join(POOLERS)} "
            "(session or transaction: PgBouncer with pool_mode = session or transaction)"
        )
    if pooler != "transaction":
        if config.get("ENGINE") == "django.db.backends.postgresql":
            config.setdefault("OPTIONS", {}).setdefault("prepare_threshold", PREPARE_THRESHOLD)
        return config
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise ImproperlyConfigured("DATABASE_POOLER=transaction: DATABASE_URL must name PostgreSQL")
    options = config.setdefault("OPTIONS", {})
    if options.get("prepare_threshold") is not None:
        raise ImproperlyConfigured(
            "DATABASE_URL: prepare_threshold cannot be used with DATABASE_POOLER=transaction "
            "(a statement prepared on one server session is unknown to the next)"
        )
    options["prepare_threshold"] = None
    config["DISABLE_SERVER_SIDE_CURSORS"] = True
    return config


def detect_dead_peers(config: dict[str, Any], *, server: bool) -> dict[str, Any]:
    """``config`` (a ``DATABASES`` entry or ``liveness_settings``) told to give up on a vanished peer, in
    place (see the module's docstring): ``DEAD_PEER`` for our end, and with ``server`` (a connection
    straight to PostgreSQL, no pooler) ``SERVER_DEAD_PEER`` for the server's. A value the URL already
    sets is kept. Not PostgreSQL: unchanged."""
    if config.get("ENGINE", "django.db.backends.postgresql") != "django.db.backends.postgresql":
        return config
    options = config.setdefault("OPTIONS", {})
    for name, value in DEAD_PEER.items():
        options.setdefault(name, value)
    if server:
        given = str(options.get("options", ""))
        asked = [f"-c {name}={value}" for name, value in SERVER_DEAD_PEER.items() if name not in given]
        options["options"] = " ".join([given, *asked]).strip()
    return config


def liveness_settings(env: environ.Env, url: str) -> dict[str, Any] | None:
    """Where the worker's liveness lock connects (``DATABASE_LIVENESS_URL``): the connection fields of a
    ``DATABASES`` entry, parsed as ``DATABASE_URL`` is (several hosts too). None when ``url`` is empty:
    the lock goes where ``DATABASE_URL`` points."""
    if not url:
        return None
    if urlsplit(url).scheme not in POSTGRES_SCHEMES:
        raise ImproperlyConfigured(
            f"DATABASE_LIVENESS_URL: {_shown(url)} is not a PostgreSQL URL "
            "(the liveness lock is a PostgreSQL advisory lock)"
        )
    try:
        config = database_settings(env, url)
    except ImproperlyConfigured as exc:
        raise ImproperlyConfigured(str(exc).replace("DATABASE_URL", "DATABASE_LIVENESS_URL", 1)) from None
    return {field: config[field] for field in ("NAME", "USER", "PASSWORD", "HOST", "PORT", "OPTIONS")
            if field in config}  # fmt: skip


def require_direct_liveness(pooler: str, liveness: bool, direct: dict[str, Any] | None) -> None:
    """Refuse to start with the liveness lock behind a transaction pooler: the lock would stay on a
    pooled server session after its worker died, and the worker's leases would wait for their TTL."""
    if pooler == "transaction" and liveness and direct is None:
        raise ImproperlyConfigured(
            "DATABASE_POOLER=transaction: set DATABASE_LIVENESS_URL to a direct PostgreSQL URL (not "
            "through the pooler) for the workers' liveness locks, or WORKER_LIVENESS=0 (leases then "
            "lapse by their TTL only)"
        )
