"""Every documented benchmark still runs from its command: a tiny run of each.

The figures are not checked (speed is measured by the benchmarks themselves,
not by timed tests); what is checked is that each run finishes, verifies what
it wrote, and prints its table. Each run creates and drops its own database on
the test server, named per xdist worker so parallel runs never collide, copied
from the migrated template (``bench/common.py``: a migrate per run cost more
than the run). The runs are small (one cell each, ``--smoke``: no VACUUM and
CHECKPOINT before each measurement) but go through the documented command
from end to end. ``bench/all.py --quick`` reruns all of them in one go, so it
is marked ``slow``: out of the default run, in ``make soak-tests``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys

import psycopg
import pytest

from bench.common import with_dbname
from tests.workflow import ROOT, database_url

# No django_db: each run makes its own database on the test server (database_url() only names it),
# so the test needs no test database of its own (creating one costs more than a smoke).
pytestmark = [pytest.mark.timeout(180)]


def server_url() -> str:
    """The test server, through its maintenance database: no test database is made for these tests."""
    return with_dbname(database_url(), "postgres")


def run_bench(script: str, *args: str, saves: bool = True, timeout: float = 170) -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "solo")
    env = {**os.environ, "DATABASE_URL": server_url()}
    database = f"smoke_{script.split('.')[0]}_{worker}"
    command = [
        sys.executable,
        f"bench/{script}",
        "--database",
        database,
        *(["--no-save"] if saves else []),
        *args,
    ]
    stdout, stderr, returncode = run_in_own_group(command, env, timeout)
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    return stdout


def run_in_own_group(command: list[str], env: dict[str, str], timeout: float) -> tuple[str, str, int]:
    """Run a bench script in a process group of its own. If the test gives up on it (a timeout, or
    pytest-timeout), the whole group gets SIGTERM (the script's ``finally`` stops its workers and
    servers and drops its database), then SIGKILL: no worker or gunicorn is left behind."""
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException:
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=wait)
        raise
    return stdout, stderr, process.returncode


def test_the_transition_benchmark_runs_and_matches_advance():
    # One cell (2 writers: advance() and raw side by side), as make bench measures each of its own.
    out = run_bench("transitions.py", "--seconds", "0.3", "--warmup", "0.1", "--writers", "2", "--smoke")
    assert "advance/raw at 2 writers" in out and "hash chains intact" in out
    assert "raw path out of date" not in out  # the raw path still writes what advance() writes


def test_the_lease_benchmark_runs_and_finds_no_double_claim():
    # Two claimers compete for the same tasks: the double-claim check has something to catch.
    out = run_bench(
        "leases.py", "--seconds", "0.3", "--warmup", "0.1", "--claimers", "2", "--tasks", "20", "--smoke"
    )
    assert "no double claims" in out and "| 2 |" in out


def test_the_end_to_end_benchmark_runs_recovers_and_runs_the_peer_on_the_same_work():
    # One run for both halves of e2e.py (the throughput run with its DBOS peer, then the SIGKILL
    # recovery): each run pays for a database and a gunicorn sandbox first. One worker process (and one
    # killed, one surviving): each process's start-up is most of a small run.
    out = run_bench(
        "e2e.py",
        *("--tasks", "12", "--recovery-tasks", "40", "--concurrency", "4", "--latency-ms", "50"),
        *("--workers", "1", "--server-workers", "1", "--peers", "--smoke"),
    )
    assert "audit chains intact" in out and "SIGKILL all victims" in out
    assert re.search(r"SIGKILL all victims +40 +1 \+ 1 ", out), out[-2000:]
    assert "ours / DBOS:" in out


def test_the_approvals_benchmark_runs_at_two_sizes():
    out = run_bench(
        "approvals.py", "--small", "5", "--large", "40", "--repeat", "2", "--warmup", "1", saves=False
    )
    assert "worst ratio" in out


@pytest.mark.timeout(
    300
)  # two gunicorns and ~50 pages twice, each also through the test client for its queries
def test_the_console_benchmark_pairs_two_sizes_for_every_persona_over_http():
    out = run_bench(
        "console.py",
        *("--small", "200", "--tasks", "400", "--approvals", "20", "--history", "30"),
        *("--repeat", "1", "--warmup", "0", "--export-rows", "20", "--smoke"),
        saves=False,
        timeout=290,
    )
    assert "worst ratio" in out and "| audit export (auditor, 2 tenants) |" in out
    assert "| queue sort age (operator, 2 tenants) |" in out
    # Paired: the large database seeded to the small size is copied into the small one, both are
    # served at once, and each page's requests alternate between them.
    database = f"smoke_console_{os.environ.get('PYTEST_XDIST_WORKER', 'solo')}"
    assert f"copied      {database} into {database}_small (CREATE DATABASE ... TEMPLATE)" in out, out[-3000:]
    assert "servers     2 gunicorns started side by side" in out
    assert "paired      each page's requests alternate between the 200-task and the 400-task server" in out
    # Each server reads its own database: a filtered page shows more rows at the large size.
    rows = re.search(r"\| queue state \(operator, 1 tenant\) \|.*\| (\d+) / (\d+) \|", out)
    assert rows and int(rows[1]) < int(rows[2]), out[-3000:]
    # Both databases are dropped at the end.
    with psycopg.connect(server_url(), autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{database}%"])
        assert left.fetchall() == []


@pytest.mark.timeout(420)  # two servers and a worker start before the first task: minutes on a busy machine
def test_the_a2a_benchmark_runs_both_surfaces_on_the_same_workers_and_gives_the_ratio_and_push_latency():
    out = run_bench(
        "a2a_vs_rest.py",
        *("--tasks", "8", "--repeat", "1", "--warmup", "1", "--callers", "4", "--latency-ms", "50"),
        *("--workers", "1", "--concurrency", "4", "--poll", "0.2", "--server-workers", "1"),
        *("--push-tasks", "4", "--push-interval", "0.5"),
        timeout=400,
    )
    assert "audit chains intact" in out and "A2A / REST:" in out
    assert "  REST  8 tasks" in out and "  A2A   8 tasks" in out
    # Each of the push phase's tasks pushed its every status change (at least four: created, read,
    # model turn, completed) to the receiver, once each after dedupe, in order, signed.
    assert "  A2A+push  4 tasks" in out and "status changes pushed, each once after dedupe" in out
    pushed = re.search(r"Push: (\d+) of (\d+) status changes of 4 tasks delivered", out)
    assert pushed and int(pushed[1]) == int(pushed[2]) >= 4 * 4, out[-2000:]
    assert "(A2A_PUSH_INTERVAL 0.5 s, 1 run_worker --sweep senders)" in out


@pytest.mark.slow  # every benchmark above again, in sequence, and a backlog (~4.5 min): make soak-tests
@pytest.mark.timeout(420)
def test_the_whole_benchmark_entry_point_runs_a_reduced_matrix():
    env = {**os.environ, "DATABASE_URL": server_url()}
    prefix = f"smoke_all_{os.environ.get('PYTEST_XDIST_WORKER', 'solo')}"
    stdout, stderr, returncode = run_in_own_group(
        [sys.executable, "bench/all.py", "--quick", "--database-prefix", prefix, "--no-save"], env, 410
    )
    assert returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "ours / DBOS" in stdout and "recovery after SIGKILL" in stdout
    assert "A2A against REST" in stdout
    # Issue 27's goals table: the cells the reduced matrix measured against their goals, the rest named.
    assert (
        "## issue 27's goals" in stdout
        and "| lease claims / raw claim, 8 claimer(s) | not measured |" in stdout
    )
    assert re.search(r"\| ours / DBOS, 2 processes x 16 in flight, 0 ms model latency \| \d+\.\d\dx ", stdout)
    # The database's own commit rate beside the 16 in flight cell (pgbench), a worker's RSS at 64 in flight
    # (the backlog cell), and tasks/s with 400 queued before the workers start.
    assert re.search(
        r"\| our commits/s / pgbench's, 2 processes x 16 in flight, 0 ms model latency \| \d+\.\d\d \(",
        stdout,
    ), stdout[-3000:]
    assert re.search(r"\| RSS of one worker process, 64 in flight \(the highest seen\) \| \d+ MB ", stdout)
    assert re.search(r"\| tasks/s with 400 queued, 2 processes x 64 in flight \| \d+\.\d tasks/s \| ", stdout)
