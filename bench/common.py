"""What the benchmark scripts share: their throwaway database, Django set-up, the machine header.

Each script puts the project root on ``sys.path`` first (run as ``python bench/<name>.py``,
Python puts ``bench/`` there instead) and then imports this module as ``bench.common``.
Nothing here imports Django at module level: spawned writers import it before they set Django up.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER_URL = "postgres://postgres@127.0.0.1:5432/postgres"
RESULTS_DIR = ROOT / "bench" / "results"
# DEBUG off is production, which refuses to start without its secrets: a SECRET_KEY, the sandbox's
# token, the audit chain's key and the key sealing sensitive fields. The benches' databases are thrown
# away after each run, so public bench-only values do; spawned processes inherit them.
BENCH_ENV = {
    "SECRET_KEY": "bench-only-not-secret",
    "SANDBOX_TOKEN": "bench-only-sandbox-token",
    "AUDIT_HMAC_KEYS": "bench:bench-only-audit-chain-key-not-secret",
    "FIELD_ENCRYPTION_KEYS": "bench:YmVuY2gtb25seS1maWVsZC1rZXktbm90LXNlY3JldCE=",
    "AUDIT_ANCHOR_KEY": "sHAVCAIJNfWNtCcLdBSECMYl0zMi5aikztQznZsi7OA=",  # public, bench-only
}


# How long a server a bench starts (gunicorn with the whole project) may take to answer: seconds on a
# quiet machine, over a minute on a 2-core one with a load of 20 (seen while others ran their suites).
SERVER_START_TIMEOUT = 180.0


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def throwaway_name(base: str) -> str:
    """A default database name no other run shares: two people benchmarking against one server (or one
    person running two scripts at once, or two machines whose process ids collide) each get their own
    database instead of dropping the other's."""
    return f"{base}_{os.getpid()}_{secrets.token_hex(3)}"


class DatabaseInUse(RuntimeError):
    pass


# The databases this process created (recreate_database(create=True)): the only ones it may drop
# WITH (FORCE) at the end, past its own lingering sessions and those of the processes it spawned.
_CREATED: set[tuple[str, str]] = set()


def _server_key(server_url: str, dbname: str) -> tuple[str, str]:
    parts = urlsplit(server_url)
    return (f"{parts.hostname}:{parts.port}", dbname)


def _raise_on_termination(signum: int, _frame: Any) -> None:
    # Into the script's ``finally``: its servers and workers stop and its database is dropped.
    raise SystemExit(128 + signum)


def recreate_database(server_url: str, dbname: str, *, create: bool, template: str | None = None) -> None:
    """Create ``dbname`` afresh (``create``; a copy of ``template`` when given), or drop it at the end of
    the run (``create=False``).

    Creating: an idle database of that name (a run that was SIGKILLed, or one kept with
    ``--keep-database``) is dropped first, but without ``FORCE``: PostgreSQL refuses to drop a
    database any session uses, so somebody else's run is refused (``DatabaseInUse``), never killed.
    SIGTERM and SIGHUP then end the script through its ``finally`` as Ctrl-C does, so the database
    is dropped on those too.

    Dropping: ``WITH (FORCE)`` (past this run's own lingering sessions) only for a database this
    process created; any other is dropped only when idle, else left with a warning."""
    key = _server_key(server_url, dbname)
    with psycopg.connect(server_url, autocommit=True) as conn:
        if not create and key in _CREATED:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
            _CREATED.discard(key)
            return
        try:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(dbname)))
        except psycopg.errors.ObjectInUse as exc:
            if not create:
                print(f"WARNING     database {dbname!r} not dropped: in use by another session ({exc})")
                return
            raise DatabaseInUse(
                f"database {dbname!r} is in use by another session, perhaps another benchmark run: "
                "leave --database unset (each run gets its own) or name another one"
            ) from None
        if create:
            if template is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))
            else:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(dbname), sql.Identifier(template)))  # fmt: skip
            _CREATED.add(key)
    if create and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _raise_on_termination)
        signal.signal(signal.SIGHUP, _raise_on_termination)


# PostgreSQL cuts longer names to this many bytes (with a NOTICE only): a derived name could then
# silently be another database's.
MAX_DATABASE_NAME = 63


def copy_database(server_url: str, source: str, target: str) -> float:
    """``target`` created as a copy of ``source`` (``CREATE DATABASE target TEMPLATE source``: rows,
    indexes and statistics, block by block, without replaying any statement), dropped at the end like a
    database the run created (``drop_unless_kept``). ``source`` must be idle meanwhile (PostgreSQL
    refuses a template any session uses): close this process's connections to it first. Returns the
    seconds the copy took."""
    if len(target.encode()) > MAX_DATABASE_NAME:
        raise ValueError(f"database name {target!r} is over {MAX_DATABASE_NAME} bytes: name a shorter one")
    started = time.perf_counter()
    recreate_database(server_url, target, create=True, template=source)
    return time.perf_counter() - started


def drop_unless_kept(server_url: str, dbname: str, keep: bool) -> None:
    """The end of a run: drop its database, or say where it was kept (``--keep-database``)."""
    if keep:
        print(f"kept        database {dbname} (--keep-database): drop it with DROP DATABASE {dbname}")
        return
    recreate_database(server_url, dbname, create=False)


# Migrating a fresh database takes 15 s on a quiet 2-core machine and a minute on a busy one, for
# every run of every script. So a run's database is copied (CREATE DATABASE ... TEMPLATE) from the one
# template the test suite and the soak copy too, migrated once per set of migrations
# (scripts/migrated_template.py: ``tmpl_migrated_<digest>``). ``--fresh-migrate`` migrates the run's own
# database instead.


def add_database_arguments(parser: Any, base: str) -> None:
    """``--database``, ``--keep-database`` and ``--fresh-migrate``, as every bench script takes them."""
    parser.add_argument(
        "--database",
        default=throwaway_name(base),
        help=f"the run's throwaway database to create and drop (default {base}_<pid>_<random>)",
    )
    parser.add_argument("--keep-database", action="store_true", help="leave the database for inspection")
    parser.add_argument(
        "--fresh-migrate",
        action="store_true",
        help="migrate the run's database from scratch instead of copying the migrated template",
    )


def _migrate_into(dbname: str) -> None:
    """Run Django's migrate against ``dbname`` instead of the configured database, then point back."""
    from django.core.management import call_command
    from django.db import connections

    connection = connections["default"]
    configured = connection.settings_dict["NAME"]
    connection.close()
    connection.settings_dict["NAME"] = dbname
    try:
        call_command("migrate", verbosity=0, interactive=False)
    finally:
        connection.close()
        connection.settings_dict["NAME"] = configured


def migrate_database(server_url: str, dbname: str, *, fresh: bool = False) -> str:
    """Bring the run's database ``dbname`` (created by ``recreate_database``, still empty) to the current
    migrations; Django must be set up on it. Returns how: copied from the migrated template (built first
    if this set of migrations has none yet; runs side by side wait for one build), or migrated."""
    from django.db import connections

    from scripts import migrated_template

    if fresh:
        _migrate_into(dbname)
        print(f"database    {dbname}: migrated (--fresh-migrate)", flush=True)
        return "migrated"
    template = migrated_template.ensure(server_url)
    connections.close_all()
    with psycopg.connect(with_dbname(server_url, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(dbname)))  # ours, still empty
    migrated_template.create(server_url, dbname)
    how = f"copied from {template}"
    print(f"database    {dbname}: {how}", flush=True)
    return how


@contextmanager
def run_database(server_url: str, args: argparse.Namespace) -> Iterator[str]:
    """A run's own database, around the run: ``args.database`` (``add_database_arguments``) created on
    ``server_url``, Django set up on it with DEBUG off, migrated; yields its URL. Afterwards (on an
    error, Ctrl-C or SIGTERM too) Django's connections are closed and the database dropped, unless
    ``--keep-database``. Stop the servers and workers the run started inside the block: they use it."""
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    try:
        os.environ["DATABASE_URL"] = url
        setup_django(debug=False)
        migrate_database(server_url, args.database, fresh=args.fresh_migrate)
        yield url
    finally:
        if "django.db" in sys.modules:
            sys.modules["django.db"].connections.close_all()
        drop_unless_kept(server_url, args.database, args.keep_database)


def add_smoke_argument(parser: Any) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="a smoke run (make test): no VACUUM/CHECKPOINT before each measurement, so "
                        "the figures are noisier; every check is still made")  # fmt: skip


def settle(url: str, *, smoke: bool = False) -> None:
    """Same starting conditions for every measurement: no dead rows, no pending checkpoint. A smoke
    run (``--smoke``) skips it: a CHECKPOINT flushes the whole server's dirty buffers, seconds on a
    busy one, and a smoke's figures are not compared."""
    if smoke:
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def setup_django(debug: bool) -> None:
    """Configure Django for the database in DATABASE_URL (set by main before spawning)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DEBUG"] = "1" if debug else "0"
    for name, value in BENCH_ENV.items():  # spawned processes inherit them
        os.environ.setdefault(name, value)
    os.environ.setdefault("CELERY_BROKER_URL", "memory://")  # nothing here may reach a real broker
    import django
    from django.apps import apps

    if not apps.ready:
        django.setup()


def machine_info(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        full = conn.execute("SELECT version()").fetchone()[0]  # type: ignore[index]
        settings = dict(conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
            (["fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"],),
        ).fetchall())  # fmt: skip
    cpu = ""
    if Path("/proc/cpuinfo").exists():
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")  # fmt: skip
    return {
        "loadavg_at_start": os.getloadavg(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": __import__("django").get_version(),
        "psycopg": psycopg.__version__,
        "postgresql": server,
        "postgresql_full": full,
        "postgresql_settings": settings,
    }


def print_machine(info: dict[str, Any], *, debug: bool) -> None:
    """The header every result starts with: machine, load, server, its settings, software."""
    print(f"machine     nproc={info['nproc']}  {info['cpu']}  {info['platform']}")
    load = info["loadavg_at_start"]
    busy = "  (WARNING: the machine is busy, numbers will be noisy)" if load[0] > 0.5 else ""
    print(f"load        {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} before start{busy}")
    print(f"postgresql  {info['postgresql_full']}")
    print("settings    " + "  ".join(f"{k}={v}" for k, v in info["postgresql_settings"].items()))
    print(f"software    python {info['python']}  django {info['django']}  psycopg {info['psycopg']}  "
          f"DEBUG={'on' if debug else 'off'}")  # fmt: skip


def setup_client_benchmark(url: str, server_url: str, dbname: str, *, fresh_migrate: bool = False) -> str:
    """Django for timing pages through its test client, on the freshly created database ``url``
    (``dbname`` on ``server_url``): production settings (DEBUG off, no SSL redirect on plain HTTP),
    plain static URLs instead of the production manifest (no collectstatic), the test environment,
    every migration applied (``migrate_database``; returns how)."""
    os.environ["DATABASE_URL"] = url
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    setup_django(debug=False)
    from django.conf import settings
    from django.test import override_settings
    from django.test.utils import setup_test_environment

    setup_test_environment()
    storages = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    override_settings(STORAGES=storages).enable()
    return migrate_database(server_url, dbname, fresh=fresh_migrate)


def signed_in_client(user: Any) -> Any:
    """A test client signed in as ``user`` past the second factor, as a person who gave a code would be
    (approvers and admins give one: ``tenancy.second_factor``); the benches time pages, not logins."""
    from django.test import Client
    from django_otp import DEVICE_ID_SESSION_KEY
    from django_otp.plugins.otp_totp.models import TOTPDevice

    client = Client()
    client.force_login(user)
    device, _ = TOTPDevice.objects.get_or_create(user=user, name="bench", defaults={"confirmed": True})
    session = client.session
    session[DEVICE_ID_SESSION_KEY] = device.persistent_id
    session.save()
    return client
