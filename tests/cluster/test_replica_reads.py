"""The console and the API read from a real streaming replica, and a caller reads their own writes.

``make cluster-test`` (marker ``cluster``). A throwaway primary and its
streaming standby (``tests.chaos.standby``: ``initdb`` and ``pg_basebackup -R``,
each a server of its own on loopback), our schema and this test's users copied
onto the primary; the web under gunicorn with ``DATABASE_URL`` on the primary and
``DATABASE_REPLICA_URL`` on the standby (``config/db_router.py``). Each response
says where its page read (``X-Read-From``).

1. ``test_pages_read_the_replica_and_the_writer_reads_their_own_write``: with
   the standby caught up, the queue, audit, dashboard and task pages and the
   API's reads come from the replica. Replay is paused on the standby
   (``pg_wal_replay_pause()``) and one user creates a task: a user who did not
   write still reads the replica and does not see it (404: the replica's older
   data), the writer sees it at once in the API and the console (read on the
   primary, "behind your write"). A web whose ``DATABASE_REPLICA_MAX_LAG`` the
   paused standby exceeds reads the primary for everyone. Replay resumes: both
   read the task from the replica. Then a worker, started with the replica in
   its environment, completes the task: the standby, logging every connection,
   never sees one from it (and does see the web's).
2. ``test_a_stopped_replica_leaves_every_page_answering_from_the_primary``: the
   standby is stopped: every page answers 200 from the primary, never an error;
   started again, pages go back to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.test import Client

from config.db_router import RETRY_AFTER
from tasks.states import State
from tenancy.models import Role, Scope
from tenancy.services import token_create
from tests.chaos.standby import Cluster, free_port, workspace
from tests.chaos.test_standby_failover import Fleet, copy_schema, invoice
from tests.conftest import make_user
from tests.workflow import ROOT, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

DATABASE = "durable"
WEB_APP = "replica-test-web"  # application_name of the web's connections (PGAPPNAME)
WORKER_APP = "replica-test-worker"
PAGES = ["/console/", "/console/audit/", "/console/dashboard/", "/api/tasks/"]


class Web:
    """The web under gunicorn, its primary and replica given."""

    def __init__(self, primary: Cluster, standby: Cluster, log: Path, *, max_lag: float):
        self.port = free_port()
        self.log = log
        env = {
            **os.environ,
            "DATABASE_URL": primary.url(DATABASE),
            "DATABASE_REPLICA_URL": standby.url(DATABASE),
            "DATABASE_REPLICA_MAX_LAG": str(max_lag),
            "PGAPPNAME": WEB_APP,
            "LOG_LEVEL": "WARNING",
        }
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "config.wsgi:application",
                 "--bind", f"127.0.0.1:{self.port}", "--workers", "1", "--threads", "4",
                 "--worker-class", "gthread", "--log-level", "warning"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def wait(self) -> None:
        def answers() -> bool:
            assert self.process.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5)
            except httpx.TransportError:
                return False
            return True

        wait_for(answers, timeout=90, what="gunicorn to answer")

    def client(self, *, token: str = "", session: str = "") -> httpx.Client:
        headers = {"Authorization": f"Token {token}"} if token else {}
        if session:
            headers["Cookie"] = f"{settings.SESSION_COOKIE_NAME}={session}"
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=headers, timeout=30)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Caller:
    api: httpx.Client
    console: httpx.Client


@dataclass
class Setup:
    root: Path
    primary: Cluster
    standby: Cluster
    writer: dict[str, Caller]  # by web name
    reader: dict[str, Caller]
    webs: dict[str, Web]

    def caught_up(self) -> None:
        self.standby.wait_replayed(self.primary.wal_position(), timeout=60)


def _session_of(user) -> str:
    client = Client()
    client.force_login(user)  # the second factor counted as given (tests/conftest.py)
    return client.cookies[settings.SESSION_COOKIE_NAME].value


def read(client: httpx.Client, path: str) -> tuple[int, str]:
    """A page's status and where it read (X-Read-From)."""
    response = client.get(path)
    assert response.status_code < 500, f"{path}: {response.status_code} {response.text[:500]}"
    return response.status_code, response.headers.get("X-Read-From", "")


@pytest.fixture
def setup(acme, tmp_path) -> Iterator[Setup]:
    # Both operators of acme: their tokens create and read tasks, their sessions open the console.
    users = {"writer": make_user("replica-writer", acme, Role.OPERATOR),
             "reader": make_user("replica-reader", acme, Role.OPERATOR)}  # fmt: skip
    tokens = {name: token_create(user, scopes=[Scope.INTEGRATE, Scope.READ], expires_at=None)[1]
              for name, user in users.items()}  # fmt: skip
    sessions = {name: _session_of(user) for name, user in users.items()}
    root = workspace()
    primary = Cluster.primary(root)
    standby: Cluster | None = None
    webs: dict[str, Web] = {}
    try:
        primary.query(f"CREATE DATABASE {DATABASE}")
        copy_schema(primary)
        standby = Cluster.standby_of(primary, root)
        standby.query("ALTER SYSTEM SET log_connections = on")  # a file, not WAL: a standby takes it
        standby.query("SELECT pg_reload_conf()")
        # "patient" waits for anything; "strict" reads the primary once the replica lags a second.
        webs = {name: Web(primary, standby, tmp_path / f"web-{name}.log", max_lag=lag)
                for name, lag in (("patient", 600), ("strict", 1))}  # fmt: skip
        for web in webs.values():
            web.wait()
        callers = {
            name: {web_name: Caller(web.client(token=tokens[name]), web.client(session=sessions[name]))
                   for web_name, web in webs.items()}
            for name in users
        }  # fmt: skip
        yield Setup(root, primary, standby, callers["writer"], callers["reader"], webs)
        for web in webs.values():
            assert b"Traceback" not in web.log.read_bytes(), web.log.read_text(errors="replace")[-4000:]
    finally:
        for web in webs.values():
            web.stop()
        for cluster in (standby, primary):
            if cluster is not None:
                cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)


def test_pages_read_the_replica_and_the_writer_reads_their_own_write(
    setup: Setup, sandbox, tmp_path, monkeypatch
):
    primary, standby = setup.primary, setup.standby
    writer, reader = setup.writer["patient"], setup.reader["patient"]
    setup.caught_up()

    # 1. Caught up: the heavy read pages read the replica, for both.
    for caller in (writer, reader):
        for path in PAGES:
            client = caller.api if path.startswith("/api/") else caller.console
            assert read(client, path) == (200, "replica"), path

    # 2. Replay paused; the writer creates a task on the primary.
    primary.query("SELECT txid_current()")  # a fresh commit replayed: the pause starts with no lag
    setup.caught_up()
    standby.query("SELECT pg_wal_replay_pause()")
    wait_for(lambda: standby.query("SELECT pg_get_wal_replay_pause_state()")[0][0] == "paused",
             timeout=30, what="replay to pause")  # fmt: skip
    created = writer.api.post("/api/tasks/", json=invoice(1))
    assert created.status_code == 201, created.text
    task_id = created.json()["id"]
    written = primary.wal_position()
    assert standby.query("SELECT pg_last_wal_replay_lsn() < %s::pg_lsn", (written,))[0][0]

    # The reader did not write: their pages read the replica, which has not replayed the task.
    assert read(reader.api, f"/api/tasks/{task_id}/") == (404, "replica")
    assert read(reader.console, f"/console/tasks/{task_id}/") == (404, "replica")
    assert task_id not in reader.api.get("/api/tasks/").text
    # The writer reads their write at once, from the primary, in the API and the console alike.
    status, where = read(writer.api, f"/api/tasks/{task_id}/")
    assert (status, where) == (200, "primary; replica behind your write")
    assert read(writer.console, f"/console/tasks/{task_id}/") == (200, "primary; replica behind your write")
    assert task_id in writer.api.get("/api/tasks/").text
    # A web that tolerates one second of lag reads the primary for everyone once replay stalls that long.
    time.sleep(1.5)
    strict = setup.reader["strict"].api.get(f"/api/tasks/{task_id}/")
    assert (strict.status_code, strict.headers["X-Read-From"]) == (200, "primary; replica lags")
    assert float(strict.headers["X-Replica-Lag"]) > 1

    # 3. Replay resumes: both read the task, from the replica.
    standby.query("SELECT pg_wal_replay_resume()")
    standby.wait_replayed(written)
    assert read(reader.api, f"/api/tasks/{task_id}/") == (200, "replica")
    assert read(writer.api, f"/api/tasks/{task_id}/") == (200, "replica")
    assert read(writer.console, f"/console/tasks/{task_id}/") == (200, "replica")

    # 4. A worker with the replica in its environment runs the task: it never connects to the replica.
    url = primary.url(DATABASE)
    fleet = Fleet(sandbox, tmp_path, url)
    with monkeypatch.context() as env:  # the worker's environment only, not this process's connections
        env.setenv("DATABASE_REPLICA_URL", standby.url(DATABASE))
        env.setenv("PGAPPNAME", WORKER_APP)
        fleet.start(1, 2)
    try:
        wait_for(
            lambda: (
                primary.query("SELECT state FROM tasks_task WHERE id = %s", (task_id,), dbname=DATABASE)[0][0]
                == State.COMPLETED
                or fleet.dead()
            ),
            timeout=120,
            what="the worker to complete the task",
        )
        assert not fleet.dead(), fleet.dead()
    finally:
        fleet.stop()
    connections = standby.log.read_text(errors="replace")
    assert f"application_name={WEB_APP}" in connections  # the control: the web's reads are logged
    assert f"application_name={WORKER_APP}" not in connections
    assert primary.query("SELECT count(*) FROM tasks_lease WHERE task_id = %s", (task_id,), dbname=DATABASE)[
        0
    ][0], "the worker claimed on the primary"


def test_a_stopped_replica_leaves_every_page_answering_from_the_primary(setup: Setup):
    reader = setup.reader["patient"]
    setup.caught_up()
    assert read(reader.console, "/console/") == (200, "replica")

    setup.standby.stop("immediate")
    started = time.monotonic()
    for path in [*PAGES, "/console/audit/", "/console/"]:
        client = reader.api if path.startswith("/api/") else reader.console
        assert read(client, path) == (200, "primary; replica unavailable"), path
    assert time.monotonic() - started < 30  # no page waits for the missing replica

    # Back: once the web asks again (RETRY_AFTER seconds after it found it gone), pages read it again.
    setup.standby.start()
    wait_for(lambda: read(reader.console, "/console/") == (200, "replica"), timeout=RETRY_AFTER + 60,
             what="pages to read the replica again")  # fmt: skip
