"""A migrated database in a second: copies of one template, built once per set of migrations.

Every soak, benchmark and the test suite's own databases start from a fresh, fully migrated schema.
Running the migrations takes 20-30 s on a quiet two-core machine (minutes on a loaded one); copying a
database that already holds them (``CREATE DATABASE … TEMPLATE``) takes about a second. The template is
named by a digest of every migration file of the project and of the locked dependencies (whose apps
bring migrations of their own), so a changed migration builds a new one; templates of other digests
are dropped when nobody uses them.

Building is serialised by an advisory lock on the server's maintenance database: two runs that start
together build once, the second waits and copies. A template is built under a temporary name and
renamed when its migrations are done, so a half-built one is never copied. Callers still run
``migrate`` on their copy (a no-op that runs in seconds): what the copy holds is exactly what
migrations produce, and anything newer than the template would still be applied.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
PREFIX = "tmpl_migrated_"
LOCK = 0x6D696772  # the advisory lock key of a build ("migr")


def with_dbname(url: str, dbname: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{dbname}"))


def digest() -> str:
    """What the template's schema depends on: every migration file and the dependency locks."""
    hashed = hashlib.sha256()
    files = sorted(ROOT.glob("*/migrations/*.py")) + sorted((ROOT / "requirements").glob("*.lock"))
    for path in files:
        hashed.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return hashed.hexdigest()[:16]


def template_name() -> str:
    return PREFIX + digest()


def _exists(conn: psycopg.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def _build(server_url: str, conn: psycopg.Connection, name: str) -> None:
    building = f"{name}_building"
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(building)))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": with_dbname(server_url, building),
        "DEBUG": "1",  # migrations read no secret; this spares the caller from giving one
    }
    env.pop("DATABASE_POOLER", None)
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "migrate", "--no-input", "-v0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(building)))
        raise RuntimeError(f"migrating the template failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    # Nobody may connect to it (a session on a template blocks every copy), and it gets its name only now.
    conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(building)))
    rename = sql.SQL("ALTER DATABASE {} RENAME TO {}")
    conn.execute(rename.format(sql.Identifier(building), sql.Identifier(name)))
    for (old,) in conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s", (PREFIX + "%", name)
    ).fetchall():
        try:
            conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(old)))
        except psycopg.errors.ObjectInUse:
            pass  # somebody is building it: theirs


def ensure(server_url: str) -> str:
    """The name of the migrated template on the server ``server_url`` names, built if missing."""
    name = template_name()
    with psycopg.connect(with_dbname(server_url, "postgres"), autocommit=True) as conn:
        if _exists(conn, name):
            return name
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK,))
        try:
            if not _exists(conn, name):  # not built while we waited
                _build(server_url, conn, name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
    return name


def create(server_url: str, dbname: str) -> None:
    """Create ``dbname`` (which must not exist) as a copy of the migrated template."""
    name = ensure(server_url)
    with psycopg.connect(with_dbname(server_url, "postgres"), autocommit=True) as conn:
        copy = sql.SQL("CREATE DATABASE {} TEMPLATE {}")
        conn.execute(copy.format(sql.Identifier(dbname), sql.Identifier(name)))


if __name__ == "__main__":  # python scripts/migrated_template.py: build (or find) it and print its name
    print(ensure(os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"))
