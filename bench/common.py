"""What the benchmark scripts share: their throwaway database, Django set-up, the machine header.

Each script puts the project root on ``sys.path`` first (run as ``python bench/<name>.py``,
Python puts ``bench/`` there instead) and then imports this module as ``bench.common``.
Nothing here imports Django at module level: spawned writers import it before they set Django up.
"""

from __future__ import annotations

import os
import platform
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


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def throwaway_name(base: str) -> str:
    """A default database name no other run shares: two people benchmarking against one server (or one
    person running two scripts at once) each get their own database instead of dropping the other's."""
    return f"{base}_{os.getpid()}"


class DatabaseInUse(RuntimeError):
    pass


def recreate_database(server_url: str, dbname: str, *, create: bool) -> None:
    """Create ``dbname`` afresh (``create``), or drop it at the end of the run (even with our own sessions
    left). Before creating, a database of that name that another session is using is refused, never
    dropped: it is somebody else's run."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        if create:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                (dbname,),
            ).fetchone()
            if row and row[0]:
                raise DatabaseInUse(
                    f"database {dbname!r} is in use by {row[0]} session(s), perhaps another benchmark run: "
                    "leave --database unset (each run gets its own) or name another one"
                )
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(dbname)))
        if create:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(dbname)))


def settle(url: str) -> None:
    """Same starting conditions for every measurement: no dead rows, no pending checkpoint."""
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


def setup_client_benchmark(url: str) -> None:
    """Django for timing pages through its test client, on the freshly created database ``url``:
    production settings (DEBUG off, no SSL redirect on plain HTTP), plain static URLs instead of the
    production manifest (no collectstatic), the test environment, every migration applied."""
    os.environ["DATABASE_URL"] = url
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    setup_django(debug=False)
    from django.conf import settings
    from django.core.management import call_command
    from django.test import override_settings
    from django.test.utils import setup_test_environment

    setup_test_environment()
    storages = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }
    override_settings(STORAGES=storages).enable()
    call_command("migrate", verbosity=0, interactive=False)


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
