"""Helpers for tests that run the workflows against the sandbox over real HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.db import connection

from demo.sandbox.models import Record
from tasks.models import Task

ROOT = Path(__file__).resolve().parents[1]


def put_order(
    order_id: str,
    *,
    status: str = "delivered",
    total: str = "100.00",
    card: str = "visa-4242",
    currency: str = "USD",
    **more: str,
) -> Record:
    """Create or replace an order in the sandbox's order system (a replacement bumps its version).
    ``more``: other fields of the record (``tenant``, its owner: ``runtime.evidence``)."""
    data = {"status": status, "total": total, "currency": currency, "card": card, **more}
    record, created = Record.objects.get_or_create(
        system="orders", record_id=order_id, defaults={"data": data}
    )
    if not created:
        record.data = data
        record.version += 1
        record.save()
    return record


def database_url() -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def sessions_named(application_name: str) -> int:
    """Sessions on this test database whose ``application_name`` is the given one."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]


def wait_for(predicate: Callable[[], object], *, timeout: float = 30, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def state_of(task: Task) -> tuple[str, int]:
    row = Task.objects.filter(pk=task.pk).values_list("state", "state_version").get()
    return row[0], row[1]


class WorkerProcess:
    """A real ``manage.py run_worker`` process against the test database."""

    def __init__(
        self,
        sandbox_url: str,
        tmp_path: Path,
        *,
        pause_after: str = "",
        lease_ttl: float = 1.0,
        extra_env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
    ):
        self.marker = tmp_path / f"paused-{time.monotonic_ns()}"
        env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "SANDBOX_BASE_URL": sandbox_url,
            "CELERY_BROKER_URL": "memory://",
            "DURABLE_PAUSE_AFTER": pause_after,
            "DURABLE_PAUSE_FILE": str(self.marker),
            "CONNECTOR_TIMEOUT": "2",
            **(extra_env or {}),
        }
        command = [
            sys.executable,
            "manage.py",
            "run_worker",
            "--sweep",
            "--idle",
            "0.1",
            "--lease-ttl",
            str(lease_ttl),
            *args,
        ]
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def wait_paused(self, timeout: float = 60) -> str:
        """Block until the worker holds still right after the chosen commit; return 'task_id version'."""
        wait_for(
            lambda: self.marker.exists() or self.process.poll() is not None,
            timeout=timeout,
            what="the worker to reach the pause point",
        )
        if not self.marker.exists():
            raise AssertionError(f"worker exited early:\n{self.process.stdout.read()}")
        return self.marker.read_text().strip()

    def kill(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        assert self.process.returncode == -signal.SIGKILL

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def stop_all(workers: list[WorkerProcess]) -> None:
    """SIGTERM every worker first, then wait for each: a worker may take seconds to hand its tasks
    back, and stopping them one after another would add those seconds up."""
    for worker in workers:
        if worker.process.poll() is None:
            worker.process.terminate()
    for worker in workers:
        try:
            worker.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()


def approve(task: Task, approver, decision: str = "approve"):
    """Decide the task's pending approval request as ``approver`` would in the console."""
    from approvals.models import ApprovalRequest
    from approvals.services import approval_decide

    request = ApprovalRequest.objects.filter(task=task, status="pending").latest("created_at")
    return approval_decide(request, user=approver, decision=decision, digest_seen=request.digest)
