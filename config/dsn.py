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
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

POSTGRES_SCHEMES = {"postgres", "postgresql", "pgsql", "psql"}
DEFAULT_PORT = "5432"
SESSION_ATTRS = {"any", "read-write", "read-only", "primary", "standby", "prefer-standby"}
CONNECT_TIMEOUT = 5  # seconds per host


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
