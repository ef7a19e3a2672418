"""A real PgBouncer in transaction mode on loopback, in front of the shared PostgreSQL.

``Bouncer`` starts Debian's ``pgbouncer`` (``scripts/ensure-cluster-packages``)
on a spare port with ``pool_mode = transaction``, trust authentication and every
database name passed through to the upstream server (``*``): a client that asks
for ``test_x`` gets a server session on ``test_x`` for the length of one
transaction. PgBouncer refuses to run as root: as root, it drops to the
``postgres`` OS user once it has read its configuration.

Run as a module, it runs a command behind a fresh PgBouncer — the worker test
directories, for ``make pgbouncer-test``::

    python -m tests.cluster.pgbouncer -- pytest -p tests.cluster.behind_pgbouncer tests/runtime

The command gets ``DATABASE_URL`` through the pooler (same database name),
``DATABASE_POOLER=transaction`` and ``DATABASE_LIVENESS_URL`` set to the direct
``DATABASE_URL`` it was given; PgBouncer stops when the command ends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from tests.chaos.standby import bindir, free_port

BINARY = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
USER = "postgres"  # the role the tests connect as (trust), and the OS user PgBouncer drops to as root


def available() -> bool:
    return os.access(BINARY, os.X_OK)


class Bouncer:
    """One PgBouncer process: ``url(db)`` reaches ``db`` on the upstream server through it."""

    def __init__(self, upstream: tuple[str, int] = ("127.0.0.1", 5432), *, pool_size: int = 10):
        self.root = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
        self.port = free_port()
        host, port = upstream
        (self.root / "users.txt").write_text(f'"{USER}" ""\n')
        lines = [
            "[databases]",
            f"* = host={host} port={port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {self.root / 'users.txt'}",
            "pool_mode = transaction",
            f"default_pool_size = {pool_size}",
            "max_client_conn = 1000",
            f"admin_users = {USER}",
            "ignore_startup_parameters = extra_float_digits",
        ]
        if os.geteuid() == 0:
            lines.append(f"user = {USER}")
        self.ini = self.root / "pgbouncer.ini"
        self.ini.write_text("\n".join(lines) + "\n")
        self.log = self.root / "pgbouncer.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen([BINARY, str(self.ini)], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"pgbouncer did not start: {self.log.read_text(errors='replace')}")
            time.sleep(0.1)

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.url("postgres"), connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def url(self, dbname: str) -> str:
        return f"postgres://{USER}@127.0.0.1:{self.port}/{dbname}"

    def admin(self, command: str) -> list[dict[str, str]]:
        return admin(self.port, command)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: PgBouncer closes every connection and exits
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def admin(port: int, command: str) -> list[dict[str, str]]:
    """A command on the admin console of the PgBouncer on ``port`` (``SHOW CLIENTS``, ``KILL db``…), its
    rows by column. Through psql: the console speaks only the simple query protocol."""
    done = subprocess.run(
        [str(bindir() / "psql"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, "-d", "pgbouncer",
         "-X", "-A", "-F", "\t", "-P", "footer=off", "-c", command],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines() if line]
    return [dict(zip(rows[0], row, strict=False)) for row in rows[1:]] if rows else []


def _through(bouncer: Bouncer, direct: str) -> str:
    """``direct`` with its host and port replaced by the bouncer's (user, database and query kept)."""
    parts = urlsplit(direct)
    users = parts.netloc.rpartition("@")[0]
    at = f"127.0.0.1:{bouncer.port}"
    return parts._replace(netloc=f"{users}@{at}" if users else at).geturl()


def main(argv: list[str]) -> int:
    command = argv[argv.index("--") + 1 :] if "--" in argv else argv
    direct = os.environ["DATABASE_URL"]
    upstream = urlsplit(direct)
    bouncer = Bouncer((upstream.hostname or "127.0.0.1", upstream.port or 5432))
    try:
        env = {**os.environ, "DATABASE_URL": _through(bouncer, direct), "DATABASE_POOLER": "transaction",
               "DATABASE_LIVENESS_URL": direct, "PGBOUNCER_PORT": str(bouncer.port)}  # fmt: skip
        print(f"behind PgBouncer (transaction mode), port {bouncer.port}: {' '.join(command)}", flush=True)
        return subprocess.run(command, env=env).returncode
    finally:
        bouncer.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
