"""Real processes for chaos tests: a PostgreSQL proxy that can "restart", and Celery worker and beat.

- ``PostgresProxy`` sits between worker processes and the shared PostgreSQL.
  ``restart()`` does to its clients what a database restart or failover does —
  every connection dies at once, new ones are refused for a while — without
  touching the cluster other tests run against.
- ``CeleryProcess`` runs ``celery -A config worker|beat`` (the README's
  production commands) against the test database and a real Redis broker,
  isolated from every other run by a key prefix of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from django.db import connection

from tests.workflow import ROOT, database_url, wait_for

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


class PostgresProxy:
    """A TCP proxy to PostgreSQL whose ``restart()`` drops every connection and refuses new ones."""

    def __init__(self, upstream: tuple[str, int] | None = None):
        db = connection.settings_dict
        self.upstream = upstream or (db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self.accepted = 0
        self.refused = 0
        threading.Thread(target=self._accept_loop, name="pg-proxy-accept", daemon=True).start()

    def database_url(self) -> str:
        """The test database's URL, through this proxy."""
        db = connection.settings_dict
        return f"postgres://{db['USER']}@127.0.0.1:{self.port}/{db['NAME']}"

    def go_down(self) -> None:
        """The database goes away: every proxied connection is cut, new ones are refused."""
        self._up.clear()
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            _cut(sock)

    def come_up(self) -> None:
        self._up.set()

    def restart(self, downtime: float = 5.0) -> None:
        self.go_down()
        time.sleep(downtime)
        self.come_up()

    def close(self) -> None:
        self.go_down()
        self._listener.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._up.is_set():
                # Refused: an RST, as a closed port or a server still starting would give.
                self.refused += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            self.accepted += 1
            with self._lock:
                self._open.update((client, server))
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with self._lock:
                    self._open.discard(sock)
                _cut(sock)


def _cut(sock: socket.socket) -> None:
    # shutdown() wakes the pump thread blocked in recv() on this socket; close() alone would not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class CeleryProcess:
    """``celery -A config worker`` or ``beat`` as a real process, logging to a file under ``tmp_path``."""

    def __init__(self, argv: list[str], *, env: dict[str, str], log: Path):
        self.log = log
        self._log_file = log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", *argv],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            # Its own process group, so that a Ctrl-C at the test's terminal does not reach it.
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        """Pids of the worker's pool processes (prefork children)."""
        try:
            return [
                int(pid) for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
            ]
        except FileNotFoundError:
            return []

    def wait_ready(self, text: str, timeout: float = 60) -> None:
        wait_for(
            lambda: text in self.output() or not self.running(),
            timeout=timeout,
            what=f"celery to log {text!r}",
        )
        if not self.running():
            raise AssertionError(f"celery exited early:\n{self.output()[-5000:]}")

    def stop(self) -> None:
        children = self.children()
        if self.running():
            self.process.send_signal(signal.SIGQUIT)  # cold shutdown: tests wait for nothing in flight
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for pid in children:  # pool processes the parent may have left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self._log_file.close()


class CeleryCluster:
    """A Celery worker and beat for one region, on their own Redis key prefix."""

    def __init__(self, tmp_path: Path, *, env: dict[str, str]):
        self.tmp_path = tmp_path
        self.region = f"chaos-{uuid.uuid4().hex[:10]}"
        self.key_prefix = f"test-{self.region}:"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_BROKER_KEY_PREFIX": self.key_prefix,
            "WORKER_REGION": self.region,
            "SWEEP_INTERVAL": "1",
            "RECONCILE_INTERVAL": "1",
            "CONNECTOR_TIMEOUT": "2",
            "LOG_LEVEL": "WARNING",
            **env,
        }
        self.started: list[CeleryProcess] = []
        if self.env["CELERY_BROKER_URL"].startswith("redis://"):
            _require_redis()

    def worker(self, concurrency: int = 2, name: str = "worker", pool: str | None = None) -> CeleryProcess:
        """A worker of the region; ``name`` tells several apart (their node names and log files); ``pool``
        overrides the settings' pool (``-P``)."""
        node = self.region if name == "worker" else f"{name}.{self.region}"
        worker = CeleryProcess(
            [
                "worker",
                "-Q",
                f"region.{self.region}",
                "-c",
                str(concurrency),
                "-n",
                f"{node}@%h",
                "--loglevel=INFO",
                *(["-P", pool] if pool else []),
            ],
            env=self.env,
            log=self.tmp_path / f"{name}.log",
        )
        self.started.append(worker)
        worker.wait_ready(" ready.")
        return worker

    def beat(self) -> CeleryProcess:
        beat = CeleryProcess(
            ["beat", "--loglevel=INFO", "-s", str(self.tmp_path / "celerybeat-schedule")],
            env=self.env,
            log=self.tmp_path / "beat.log",
        )
        self.started.append(beat)
        beat.wait_ready("beat: Starting")
        return beat

    def stop(self) -> None:
        for process in reversed(self.started):
            process.stop()
        self._forget_broker_keys()

    def _forget_broker_keys(self) -> None:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        try:
            keys = list(client.scan_iter(match=f"{self.key_prefix}*", count=500))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _require_redis() -> None:
    """Fail at once, and say why, rather than after a worker retried its broker for a minute."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        raise AssertionError(f"these tests need Redis at {REDIS_URL} (.ci/run starts it): {exc}") from exc
    finally:
        client.close()
