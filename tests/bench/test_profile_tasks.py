"""bench/profile_tasks.py's CPU accounting from /proc, on real processes, and (slow) a whole run.

A PostgreSQL backend that ended is gone from /proc; its CPU survives in the postmaster's reaped
children's times. The same holds for any parent that waits for its children, which is what the
second test builds: a parent whose busy child has ended and been waited for.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.profile_tasks import children, cpu_seconds, tree_cpu

BUSY = "import time\nend = time.process_time() + {seconds}\nwhile time.process_time() < end: pass\n"


def test_a_process_cpu_grows_with_its_work():
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert cpu_seconds(os.getpid()) - before >= 0.2


def _sleeps_after(pid: int) -> bool:
    """Whether ``pid`` runs the second child's script (its work, then the sleep)."""
    try:
        return b"time.sleep(30)" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it ended meanwhile
        return False


def test_a_parent_counts_the_cpu_of_children_it_reaped_and_of_those_alive():
    # The parent runs a busy child to its end (and waits for it), then starts a second busy child and sleeps.
    # Each works 0.5 s and is checked for 0.4: /proc counts CPU in clock ticks, sampled, and could show a
    # child that worked exactly 0.4 s by its own clock as 0.39 (then asleep: the wait below never ended).
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {BUSY.format(seconds=0.5)!r}])\n"
        f"subprocess.Popen([sys.executable, '-c', {BUSY.format(seconds=0.5)!r} + 'time.sleep(30)'])\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # The second child (the first may still be finishing its 0.4 s, not yet reaped).
            alive = [pid for pid in children(parent.pid) if _sleeps_after(pid)]
            if alive and cpu_seconds(alive[0]) >= 0.4:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the second child never finished its work")
        assert cpu_seconds(parent.pid) < 0.4  # the parent itself only waited
        assert cpu_seconds(parent.pid, reaped=True) >= 0.4  # the first child, reaped
        assert tree_cpu(parent.pid) >= 0.8  # both children
    finally:
        for pid in children(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait()


@pytest.mark.slow  # a PostgreSQL of its own, migrated, and worker processes: minutes (make soak-tests)
@pytest.mark.timeout(900)
def test_the_profile_runs_on_a_private_cluster_and_counts_statements_per_task():
    from bench.common import with_dbname
    from tests.workflow import ROOT, database_url

    done = subprocess.run(
        [sys.executable, "bench/profile_tasks.py", "--tasks", "30", "--concurrency", "4",
         "--server-workers", "1", "--private-cluster", "--sample", "--no-save"],
        cwd=ROOT, env={**os.environ, "DATABASE_URL": with_dbname(database_url(), "postgres")},
        capture_output=True, text=True, timeout=880,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "verified    30 tasks" in done.stdout
    assert "per task sent by the workers" in done.stdout and "| `COMMIT` |" in done.stdout
    # py-spy sampled the first worker: its claim loop is on the stack of what it ran.
    assert "samples of a thread holding the GIL" in done.stdout and "`runtime.loop.Loop." in done.stdout


def test_sampled_stacks_fold_by_the_projects_functions():
    """py-spy's raw lines (outermost frame first, then the count): each of our functions gets the
    share of samples it is on the stack of, and of those where it is the innermost of ours; library
    and standard-library frames count only for where the sample was."""
    from bench.profile_tasks import ROOT, fold

    ours, site = str(ROOT), "/venv/lib/python3.11/site-packages"
    lines = [
        f"thread (0x1);run (/usr/lib/python3.11/threading.py:9);_slot ({ours}/runtime/loop.py:5);"
        f"execute ({site}/django/db/utils.py:3);wait ({site}/psycopg/connection.py:7) 6",
        f"thread (0x1);_slot ({ours}/runtime/loop.py:5);_advance ({ours}/tasks/transitions.py:2);"
        f"dumps (/usr/lib/python3.11/json/__init__.py:1) 3",
        f"_advance ({ours}/tasks/transitions.py:2) 1",
        "garbage without a count",
    ]
    folded = fold(lines)
    assert folded["busy_samples"] == 10
    assert folded["by_package"] == {"psycopg": 60.0, "(python)": 30.0, "(project)": 10.0}
    assert folded["inclusive"] == {"runtime.loop._slot": 90.0, "tasks.transitions._advance": 40.0}
    assert folded["innermost"] == {"runtime.loop._slot": 60.0, "tasks.transitions._advance": 40.0}
