"""A pg_auto_failover formation on loopback: a monitor, a primary and a secondary, each its own server.

Debian's ``pg_autoctl`` (``scripts/ensure-cluster-packages``) creates and runs
every node in a temporary directory, on ports of its own, as the ``postgres`` OS
user (PostgreSQL refuses root): never the shared cluster on 5432. Each node is a
``pg_autoctl ... --run`` process (the keeper) supervising its postmaster, in a
process group of its own so that ``kill_node`` can take the whole node down at
once with SIGKILL, as a machine dying would (killing the postmaster alone, the
keeper would restart it).

pg_auto_failover's defaults: the secondary is synchronous (``replication-quorum``;
``synchronous_commit`` waits for it), so a commit the primary acknowledged is on
the secondary; when the secondary is unhealthy the monitor lets the primary take
writes alone (``wait_primary``), and the failover of such a primary is refused.
The monitor's health checks are made quick (``FAST_MONITOR``) so that the death
of the primary is noticed in seconds, not the default half minute.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.chaos.standby import bindir, free_port

SERVER_USER = "postgres"
DATABASE = "durable"
# The monitor notices a dead node in a few seconds (defaults: 5 s checks, 20 s before unhealthy).
FAST_MONITOR = {
    "pgautofailover.health_check_period": "1000",
    "pgautofailover.health_check_timeout": "1000",
    "pgautofailover.health_check_max_retries": "1",
    "pgautofailover.health_check_retry_delay": "500",
    "pgautofailover.node_considered_unhealthy_timeout": "4000",
    "pgautofailover.primary_demote_timeout": "10000",
}
SERVER_SETTINGS = {"fsync": "off"}  # the data goes with the test (a reload suffices: no restart)


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *argv] if os.geteuid() == 0 else argv


def _env(directory: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{bindir()}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PG_CONFIG": str(bindir() / "pg_config"),
        "HOME": str(directory),
        "XDG_CONFIG_HOME": str(directory / "config"),
        "XDG_DATA_HOME": str(directory / "share"),
        "PGHOST": "127.0.0.1",
    }


def _own(path: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(path, user.pw_uid, user.pw_gid)


def query(port: int, sql: str, params: tuple[object, ...] = (), dbname: str = DATABASE) -> list[tuple]:
    url = f"postgres://{SERVER_USER}@127.0.0.1:{port}/{dbname}"
    with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


@dataclass
class Node:
    name: str
    directory: Path
    port: int
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "keeper.log"

    def run(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                _as_server_user(self.argv),
                env=_env(self.directory.parent),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: kill_node takes keeper and postgres
            )

    def kill(self) -> None:
        """SIGKILL the keeper and every process of its group, then any postmaster left of its data."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                pid = int(pidfile.read_text().split()[0])
                os.killpg(os.getpgid(pid), signal.SIGKILL)

    def answers(self) -> bool:
        try:
            query(self.port, "SELECT 1", dbname="postgres")
        except psycopg.Error:
            return False
        return True

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class Formation:
    root: Path
    monitor: Node
    nodes: list[Node] = field(default_factory=list)

    @property
    def monitor_url(self) -> str:
        return f"postgres://autoctl_node@127.0.0.1:{self.monitor.port}/pg_auto_failover?sslmode=disable"

    def dsn(self, dbname: str = DATABASE) -> str:
        """Every node's address; libpq keeps the one that takes writes."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgres://{SERVER_USER}@{hosts}/{dbname}?target_session_attrs=read-write&connect_timeout=2"

    def states(self) -> dict[str, str]:
        """Each node's reported state, by name (the monitor's view)."""
        rows = query(self.monitor.port, "SELECT nodename, reportedstate FROM pgautofailover.node",
                     dbname="pg_auto_failover")  # fmt: skip
        return {str(name): str(state) for name, state in rows}

    def writer(self) -> Node | None:
        """The node that takes writes now, as ``target_session_attrs=read-write`` finds it (the monitor's
        table keeps a dead primary's last report, "primary", until it comes back)."""
        for node in self.nodes:
            with contextlib.suppress(psycopg.Error):
                if query(node.port, "SELECT NOT pg_is_in_recovery()", dbname="postgres")[0][0]:
                    return node
        return None

    def wait(self, predicate, *, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if predicate():
                    return
            time.sleep(0.2)
        logs = "\n".join(f"--- {n.name}\n{n.tail()}" for n in (self.monitor, *self.nodes))
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}; states {self._states()}\n{logs}"
        )

    def _states(self) -> dict[str, str] | str:
        try:
            return self.states()
        except psycopg.Error as exc:
            return str(exc)

    def healthy(self) -> bool:
        """A primary and a secondary, both as the monitor wants them."""
        return sorted(self.states().values()) == ["primary", "secondary"]

    def add_node(self, name: str) -> Node:
        directory = self.root / name
        directory.mkdir()
        _own(directory)
        node = Node(name, directory, free_port(), [])
        node.argv = [
            "pg_autoctl", "create", "postgres", "--pgdata", str(node.data), "--pgport", str(node.port),
            "--pgctl", str(bindir() / "pg_ctl"), "--hostname", "127.0.0.1", "--listen", "127.0.0.1",
            "--name", name, "--dbname", DATABASE, "--username", SERVER_USER, "--auth", "trust",
            "--no-ssl", "--monitor", self.monitor_url, "--run",
        ]  # fmt: skip
        node.run()
        self.nodes.append(node)
        return node

    def destroy(self) -> None:
        for node in (*self.nodes, self.monitor):
            node.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def create(timeout: float = 240) -> Formation:
    """A monitor, then a primary, then its secondary; returns once both replicate as they should."""
    root = Path(tempfile.mkdtemp(prefix="autofailover-"))
    _own(root)
    directory = root / "monitor"
    directory.mkdir()
    _own(directory)
    monitor = Node("monitor", directory, free_port(), [])
    monitor.argv = [
        "pg_autoctl", "create", "monitor", "--pgdata", str(monitor.data), "--pgport", str(monitor.port),
        "--pgctl", str(bindir() / "pg_ctl"), "--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl",
        "--run",
    ]  # fmt: skip
    formation = Formation(root, monitor)
    try:
        monitor.run()
        formation.wait(lambda: query(monitor.port, "SELECT 1", dbname="pg_auto_failover"), timeout=120,
                       what="the monitor")  # fmt: skip
        for name, value in FAST_MONITOR.items():
            query(monitor.port, f"ALTER SYSTEM SET {name} = '{value}'", dbname="pg_auto_failover")
        query(monitor.port, "SELECT pg_reload_conf()", dbname="pg_auto_failover")
        first = formation.add_node("node_1")
        formation.wait(lambda: formation.states().get("node_1") == "single", timeout=timeout, what="node_1")
        for name, value in SERVER_SETTINGS.items():
            query(first.port, f"ALTER SYSTEM SET {name} = '{value}'", dbname="postgres")
        query(first.port, "SELECT pg_reload_conf()", dbname="postgres")
        formation.add_node("node_2")
        formation.wait(formation.healthy, timeout=timeout, what="a primary and a secondary")
    except BaseException:
        formation.destroy()
        raise
    return formation
