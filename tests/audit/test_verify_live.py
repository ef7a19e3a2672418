"""verify_audit on a live system: no false breaks while workers commit, real breaks still reported.

Writers run in threads, each with its own database connection, advancing
their tasks as fast as they can while the auditor verifies every chain again
and again. A chain read apart from its task row (the row at v4, the log
already at v5) would be reported broken though nothing was tampered with.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress
from tests.workflow import ROOT, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@contextmanager
def advancing(tasks: list[Task], writers: int = 2) -> Iterator[list[int]]:
    """Keep ``tasks`` moving (READY -> READY by ``step``) in ``writers`` threads; yield commit counts."""
    stop = threading.Event()
    commits = [0] * writers
    errors: list[BaseException] = []

    def write(n: int) -> None:
        mine = tasks[n::writers]
        versions = {task.id: task.state_version for task in mine}
        try:
            while not stop.is_set():
                for task_id in versions:
                    advance(
                        task_id,
                        versions[task_id],
                        State.READY,
                        trigger="step",
                        actor=Actor.worker(f"writer-{n}"),
                        progress=progress(f"s{versions[task_id]}"),
                    )
                    versions[task_id] += 1
                    commits[n] += 1
        except BaseException as exc:  # surfaced below: a writer that dies would make the test vacuous
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    try:
        yield commits
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors


def test_verify_audit_reports_no_break_while_tasks_advance_concurrently(acme, capsys):
    tasks = [make_task(acme) for _ in range(6)]
    with advancing(tasks) as commits:
        time.sleep(0.2)  # let both writers get going
        before = sum(commits)
        for _ in range(15):
            call_command("verify_audit")  # raises CommandError on any reported break
        during = sum(commits) - before
    assert during > 15, "the writers must have committed while verify_audit ran"
    assert capsys.readouterr().err == ""


def test_a_head_edited_by_sql_is_reported_with_exit_code_1_while_others_advance(acme):
    busy = [make_task(acme) for _ in range(4)]
    edited = make_task(acme)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", ["f" * 64, edited.id])

    with advancing(busy):
        time.sleep(0.2)
        with pytest.raises(CommandError, match="1 of 5"):
            call_command("verify_audit")
        result = subprocess.run(
            [sys.executable, "manage.py", "verify_audit"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "config.settings"},
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert result.returncode == 1, result.stdout + result.stderr
    assert f"BROKEN task {edited.id} head: task's chain head does not match the newest event" in result.stderr
    assert str(busy[0].id) not in result.stderr
