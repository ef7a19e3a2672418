"""A throwaway PostgreSQL primary and its streaming standby, for failover tests.

Each ``Cluster`` is a PostgreSQL server of its own (``initdb`` in a temporary
directory, its own port on loopback), never the shared cluster other tests run
against. ``standby_of`` copies a running primary with ``pg_basebackup -R`` and
starts the copy streaming from it. ``cut_replication`` stops the stream (the
standby keeps what it replayed and hears nothing newer: asynchronous
replication lagging behind at the moment the primary dies), ``stop("immediate")``
is the primary dying, ``promote`` the standby taking over.

The server binaries come from ``PG_BINDIR``, else the newest
``/usr/lib/postgresql/<version>/bin`` (Debian's layout), else ``pg_config
--bindir``. PostgreSQL refuses to run as root: as root, every server command runs
as the ``postgres`` OS user (``runuser``), and the directories are theirs.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

SERVER_USER = "postgres"
# Small, and quick on a shared machine: the data goes with the test, so it need not reach the disk
# (fsync off). Commits stay synchronous: an acknowledged commit is in the WAL the standby is sent.
SETTINGS = "-c fsync=off -c max_connections=200 -c shared_buffers=32MB -c wal_keep_size=256MB"


def bindir() -> Path:
    """Where ``initdb``, ``pg_ctl`` and ``pg_basebackup`` are."""
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if versions:
        return versions[-1].parent
    found = shutil.which("pg_config")
    if found is None:
        raise AssertionError("no PostgreSQL server binaries: set PG_BINDIR to the directory of initdb")
    return Path(
        subprocess.run([found, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str]) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} exited {result.returncode}:\n{result.stdout}{result.stderr}")


def workspace() -> Path:
    """A temporary directory the server user owns (a root-owned pytest tmp_path is closed to it)."""
    path = Path(tempfile.mkdtemp(prefix="standby-failover-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(path, user.pw_uid, user.pw_gid)
    return path


class Cluster:
    """One PostgreSQL server in ``directory`` on ``port`` (loopback only, trust authentication)."""

    def __init__(self, directory: Path, port: int | None = None):
        self.directory = directory
        self.data = directory / "data"
        self.log = directory / "server.log"
        self.port = port or free_port()

    @classmethod
    def primary(cls, root: Path, name: str = "primary") -> Cluster:
        cluster = cls(root / name)
        cluster._mkdir()
        _run([str(bindir() / "initdb"), "-D", str(cluster.data), "-U", SERVER_USER, "-A", "trust",
              "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"])  # fmt: skip
        cluster.start()
        return cluster

    @classmethod
    def standby_of(cls, primary: Cluster, root: Path, name: str = "standby") -> Cluster:
        """A copy of ``primary`` taken now, started as its streaming standby (``-R``: it follows it)."""
        cluster = cls(root / name)
        cluster._mkdir()
        _run([str(bindir() / "pg_basebackup"), "-D", str(cluster.data), "-h", "127.0.0.1",
              "-p", str(primary.port), "-U", SERVER_USER, "-R", "-X", "stream", "--checkpoint=fast",
              "--no-sync"])  # fmt: skip
        cluster.start()
        return cluster

    def _mkdir(self) -> None:
        self.directory.mkdir()
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.directory, user.pw_uid, user.pw_gid)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgres://{SERVER_USER}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 {SETTINGS}"
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
              "-t", "60", "start"])  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: the server dies as a crashed machine would (no checkpoint, sessions cut)."""
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"])

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def query(self, sql: str, params: tuple[object, ...] = (), dbname: str = "postgres") -> list[tuple]:
        with psycopg.connect(self.url(dbname), autocommit=True, connect_timeout=5) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def wal_position(self) -> str:
        """The primary's current WAL position (an LSN)."""
        return str(self.query("SELECT pg_current_wal_lsn()::text")[0][0])

    def wait_replayed(self, position: str, timeout: float = 30) -> None:
        """Until this standby has replayed the primary's WAL up to ``position``."""
        deadline = time.monotonic() + timeout
        while not self.query("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (position,))[0][0]:
            if time.monotonic() > deadline:
                raise AssertionError(f"the standby did not replay up to {position} within {timeout}s")
            time.sleep(0.05)

    def cut_replication(self, timeout: float = 30) -> str:
        """This standby stops hearing from its primary (its WAL receiver stops); what it replayed."""
        self.query("ALTER SYSTEM SET primary_conninfo = ''")
        self.query("SELECT pg_reload_conf()")
        deadline = time.monotonic() + timeout
        while self.query("SELECT count(*) FROM pg_stat_wal_receiver")[0][0]:
            if time.monotonic() > deadline:
                raise AssertionError("the standby's WAL receiver did not stop")
            time.sleep(0.05)
        return str(self.query("SELECT pg_last_wal_replay_lsn()::text")[0][0])

    def promote(self) -> None:
        """This standby becomes a primary (takes writes) with what it has replayed."""
        assert self.query("SELECT pg_promote(wait => true, wait_seconds => 60)")[0][0], "promotion failed"

    def destroy(self) -> None:
        if self.running():
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.stop("immediate")
