"""Where an ``order_lookup`` task's cost goes: SQL statements, transactions and CPU per process class.

What it measures
    ``--tasks`` ``order_lookup`` tasks run by ``--workers`` ``manage.py run_worker`` processes with
    ``--concurrency`` in flight each, against the sandbox over HTTP (as ``bench/e2e.py``'s throughput
    run: the same processes, the same checks of every task afterwards). Reported per task:

    statements      every statement PostgreSQL ran for the run's database, from ``pg_stat_statements``
                    (reset when the workers start): calls per task (each is one round trip from a
                    Django worker, which sends one statement at a time) and server time per task
                    (executing, and planning apart: what the hot statements' prepared statements
                    save, ``tasks.hotpath.hot_cursor``), the top ``--top`` by calls. Needs the
                    extension preloaded: ``--private-cluster`` starts a PostgreSQL of its own with it
                    (``initdb`` in a temporary directory, as the ``postgres`` user when run as root;
                    ``PG_BINDIR`` names the binaries). Without it, and the shared server not
                    preloading it, only transactions are counted.
    transactions    commits and rollbacks of the run's database per task (``pg_stat_database``).
    CPU             user + system CPU per task from ``/proc/<pid>/stat``, from the workers' first
                    commit to the last completion: the worker processes; PostgreSQL (with
                    ``--private-cluster``, the whole server: the postmaster's children alive at the end
                    plus those it reaped; on the shared server, the backends of the run's database alive
                    at the end, an undercount); the sandbox (gunicorn's processes).
    samples         with ``--sample``: py-spy samples the first worker (every thread, ``--rate`` a
                    second, without pausing it) over the same span, and the stacks are folded by the
                    project's own functions: for each, the share of the worker's busy samples that
                    have it on the stack (inclusive), and the share whose innermost project frame it
                    is (where the project called into libraries from); and by where each busy sample
                    was (the leaf frame's package: django, psycopg, pydantic, the project, ...).
                    Only the thread holding the GIL is sampled (``--gil``): the shares are of the
                    worker's Python work, not of its waits on the server, a lock or a sleep.
                    Needs ``py-spy`` (in the dev lock) and ptrace rights over the worker (root, or
                    ``kernel.yama.ptrace_scope`` 0).

How to run
    .venv/bin/python bench/profile_tasks.py --tasks 300 --private-cluster
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/profile_tasks.py

    The run's database is made and dropped as in every bench script (``--database``,
    ``--keep-database``, ``--fresh-migrate``); the private cluster is destroyed at the end. JSON goes
    to ``bench/results/`` unless ``--no-save``. The load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/profile_tasks.py` puts bench/ first, not the project

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    RESULTS_DIR,
    add_database_arguments,
    machine_info,
    print_machine,
    run_database,
)
from bench.e2e import (  # noqa: E402
    DEFAULT_TTL,
    POLL,
    Server,
    Workers,
    _free_port,
    _make_orders,
    _make_tasks,
    _not_done,
    _verify,
)

TICKS = os.sysconf("SC_CLK_TCK")
SERVER_USER = "postgres"
# On the private cluster the workers and the sandbox connect as roles of their own, so each one's
# statements are told apart (pg_stat_statements' userid) from the sandbox's and this process's.
WORKER_ROLE, SANDBOX_ROLE = "bench_worker", "bench_sandbox"


def with_user(url: str, user: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.hostname}:{parts.port}"))


# ---------------------------------------------------------------------------
# CPU from /proc
# ---------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from the state on (3rd field of stat)


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User + system CPU of ``pid`` (and of its children it has waited for, with ``reaped``)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime + ((cutime + cstime) if reaped else 0)) / TICKS


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def tree_cpu(pid: int) -> float:
    """A process, its live children, and the children it reaped (a postmaster's ended backends)."""
    return cpu_seconds(pid, reaped=True) + sum(cpu_seconds(child) for child in children(pid))


# ---------------------------------------------------------------------------
# A private PostgreSQL with pg_stat_statements
# ---------------------------------------------------------------------------


def _bindir() -> Path:
    if os.environ.get("PG_BINDIR"):
        return Path(os.environ["PG_BINDIR"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise SystemExit("no PostgreSQL server binaries: set PG_BINDIR to the directory of initdb")
    return found[-1].parent


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", SERVER_USER, "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def private_cluster(settings_from: str) -> Iterator[tuple[str, int]]:
    """A PostgreSQL of its own on a free loopback port, with pg_stat_statements preloaded and the
    durability settings of the server ``settings_from`` names; yields its URL and postmaster pid."""
    with psycopg.connect(settings_from) as conn:
        same = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
            (["fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"],),
        ).fetchall())  # fmt: skip
    same["shared_buffers"] = f"{int(same['shared_buffers']) * 8}kB"  # pg_settings counts 8 kB pages
    root = Path(tempfile.mkdtemp(prefix="bench-profile-pg-"))
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_USER)
        os.chown(root, user.pw_uid, user.pw_gid)
    data, port = root / "data", _free_port()
    options = " ".join(f"-c {name}={value}" for name, value in same.items())
    options += f" -p {port} -k {root} -c listen_addresses=127.0.0.1"
    options += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
    options += " -c pg_stat_statements.track_planning=on"  # what prepared statements save is planning
    try:
        subprocess.run(_as_server_user([str(_bindir() / "initdb"), "-D", str(data), "-U", SERVER_USER,
                                        "-A", "trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"]),
                       check=True, capture_output=True, timeout=180)  # fmt: skip
        subprocess.run(_as_server_user([str(_bindir() / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                                        "-o", options, "-w", "-t", "120", "start"]),
                       check=True, capture_output=True, timeout=180)  # fmt: skip
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
        url = f"postgres://{SERVER_USER}@127.0.0.1:{port}/postgres"
        with psycopg.connect(url, autocommit=True) as conn:
            for role in (WORKER_ROLE, SANDBOX_ROLE):
                conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")  # a throwaway server on loopback
        yield url, postmaster
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(_as_server_user([str(_bindir() / "pg_ctl"), "-D", str(data), "-m", "immediate",
                                            "-w", "stop"]), capture_output=True, timeout=120)  # fmt: skip
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------


def _database_counters(url: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def _statements(url: str, role: str) -> list[tuple[str, int, float, float]] | None:
    """(query, calls, total ms executing, total ms planning) the role ran at top level (sent by a
    client, not run by a trigger) in the run's database, or None without pg_stat_statements."""
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            return [(q, int(c), float(t), float(p)) for q, c, t, p in conn.execute(
                "SELECT query, calls, total_exec_time, total_plan_time FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND userid = (SELECT oid FROM pg_roles WHERE rolname = %s) AND toplevel"
                " ORDER BY calls DESC, total_exec_time DESC",
                (role,),
            ).fetchall()]  # fmt: skip
        except psycopg.Error:
            return None


def _reset_statements(url: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
            return True
        except psycopg.Error:
            return False


def _backends(url: str) -> list[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [int(pid) for (pid,) in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()]  # fmt: skip


def _wait_done(tenant: Any, workers: Workers, max_wait: float) -> None:
    """Until every task is terminal, polling every quarter second: this process's own statements are
    counted in the same database, so they are kept few (and subtracted, see ``measure``)."""
    deadline = time.monotonic() + max_wait
    while _not_done(tenant):
        if time.monotonic() > deadline:
            raise RuntimeError(f"tasks not done after {max_wait:g} s:\n{workers.log_tails()}")
        workers.check_alive()
        time.sleep(0.25)


def _first_commit(tenant: Any, workers: Workers, max_wait: float) -> None:
    from audit.models import TransitionEvent

    deadline = time.monotonic() + max_wait
    while not TransitionEvent.objects.filter(tenant=tenant, actor_kind="worker").exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no worker committed within {max_wait:g} s:\n{workers.log_tails()}")
        workers.check_alive()
        time.sleep(POLL / 2)


def measure(
    args: argparse.Namespace, url: str, server: Server, logs: Path, postmaster: int | None
) -> dict[str, Any]:
    from django.db import connection, connections

    tenant, _ = _make_tasks("bench-profile", args.tasks)
    own = {"statements": 0}

    def count_own(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        own["statements"] += 1
        return execute(sql, params, many, context)

    connections.close_all()
    with_statements = _reset_statements(url)
    workers_url = with_user(url, WORKER_ROLE) if postmaster else url
    workers = Workers(args.workers, workers_url, server.sandbox, logs, args, args.lease_ttl)
    try:
        _first_commit(tenant, workers, args.max_wait)
        # From the first commit on: the workers' start-up (imports, Django) is not a task's cost.
        started = time.monotonic()
        load_before = os.getloadavg()
        if with_statements:
            _reset_statements(url)
        commits, rollbacks = _database_counters(url)
        cpu0 = {
            "workers": sum(cpu_seconds(p.pid) for p in workers.processes),
            "sandbox": tree_cpu(server.process.pid),
            "postgresql": tree_cpu(postmaster) if postmaster else 0.0,
        }
        done_at_start = args.tasks - _not_done(tenant)
        sampler = Sampler(workers.processes[0].pid, logs, args.rate) if args.sample else None
        try:
            with connection.execute_wrapper(count_own):
                _wait_done(tenant, workers, args.max_wait)
        finally:
            samples = sampler.stop() if sampler else None
        backends = [] if postmaster else _backends(url)
        cpu1 = {
            "workers": sum(cpu_seconds(p.pid) for p in workers.processes),
            "sandbox": tree_cpu(server.process.pid),
            "postgresql": tree_cpu(postmaster) if postmaster else sum(cpu_seconds(pid) for pid in backends),
        }
        seconds = time.monotonic() - started
        load_after = os.getloadavg()
        commits1, rollbacks1 = _database_counters(url)
        statements = _statements(url, WORKER_ROLE) if with_statements and postmaster else None
        sandbox = _statements(url, SANDBOX_ROLE) if with_statements and postmaster else None
    finally:
        workers.stop()
    checked, retried = _verify(tenant)
    counted = args.tasks - done_at_start
    per = 1000 / max(counted, 1)
    cpu_ms = {name: (cpu1[name] - cpu0[name]) * per for name in cpu0}
    if not postmaster:
        cpu_ms["postgresql"] = cpu1["postgresql"] * per  # live backends' whole life: an upper bound of theirs
    result: dict[str, Any] = {
        "tasks": args.tasks,
        "tasks_counted": counted,
        "verified": checked,
        "retried": retried,
        "seconds": seconds,
        "tasks_per_s": counted / seconds,
        "load_before": load_before,
        "load_after": load_after,
        "commits_per_task": (commits1 - commits) / max(counted, 1),
        "rollbacks_per_task": (rollbacks1 - rollbacks) / max(counted, 1),
        "cpu_ms_per_task": cpu_ms,
        "postgresql_cpu": "whole private server" if postmaster else f"{len(backends)} live backends only",
    }
    if samples is not None:
        result["samples"] = samples
    if statements is not None:
        result["statements_per_task"] = sum(calls for _, calls, _, _ in statements) / max(counted, 1)
        commits = sum(calls for query, calls, _, _ in statements if query.strip().upper() == "COMMIT")
        result["worker_commits_per_task"] = commits / max(counted, 1)
        sandbox_calls = sum(calls for _, calls, _, _ in sandbox or [])
        result["sandbox_statements_per_task"] = sandbox_calls / max(counted, 1)
        # Commits also count this process's polls (each its own transaction) and the sandbox's.
        result["own_statements"] = own["statements"]
        result["server_ms_per_task"] = sum(ms for _, _, ms, _ in statements) / max(counted, 1)  # executing
        result["server_plan_ms_per_task"] = sum(ms for _, _, _, ms in statements) / max(counted, 1)
        result["top"] = [
            {
                "calls_per_task": calls / max(counted, 1),
                "ms_per_call": ms / max(calls, 1),
                "plan_ms_per_call": plan / max(calls, 1),
                "query": query,
            }
            for query, calls, ms, plan in statements[: args.top]
        ]
    return result


def render(result: dict[str, Any]) -> str:
    lb, la = result["load_before"], result["load_after"]
    lines = [
        f"profile     {result['tasks_counted']} of {result['tasks']} order_lookup tasks (from the first "
        "commit on), "
        f"{result['tasks_per_s']:.1f} tasks/s; load {lb[0]:.2f} -> {la[0]:.2f} (1 min)",
        f"  transactions   {result['commits_per_task']:.2f} commits + {result['rollbacks_per_task']:.2f} "
        "rollbacks per task in the database (workers, sandbox and this process's polls)",
    ]
    if "statements_per_task" in result:
        lines.append(f"  statements     {result['statements_per_task']:.1f} per task sent by the workers "
                     f"(one round trip each; {result['worker_commits_per_task']:.2f} COMMITs), "
                     f"{result['server_ms_per_task']:.2f} ms server time per task executing, "
                     f"{result.get('server_plan_ms_per_task', 0):.2f} ms planning; "
                     f"the sandbox's {result['sandbox_statements_per_task']:.1f}")  # fmt: skip
    else:
        lines.append("  statements     not counted: pg_stat_statements is not preloaded (--private-cluster)")
    cpu = result["cpu_ms_per_task"]
    lines.append("  CPU per task   " + "  ".join(f"{name} {ms:.1f} ms" for name, ms in cpu.items())
                 + f"  (PostgreSQL: {result['postgresql_cpu']})")  # fmt: skip
    if result.get("top"):
        lines.append("\n| calls/task | ms/call | planning ms/call | statement |\n|---|---|---|---|")
        for row in result["top"]:
            query = " ".join(row["query"].split())[:150].replace("|", "\\|")
            lines.append(
                f"| {row['calls_per_task']:.2f} | {row['ms_per_call']:.3f} | "
                f"{row.get('plan_ms_per_call', 0):.3f} | `{query}` |"
            )
    if "samples" in result:
        lines.append(render_samples(result["samples"]))
    return "\n".join(lines)


# --- sampling one worker (py-spy) ---------------------------------------------------------------------


class Sampler:
    """py-spy recording one process in raw (folded) form until ``stop``."""

    def __init__(self, pid: int, logs: Path, rate: int) -> None:
        self.output = logs / f"py-spy-{pid}.txt"
        self.errors = logs / f"py-spy-{pid}.log"
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
        self.process = None
        self.missing = "" if spy else "py-spy is not installed (make install-dev)"
        if spy:
            argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--threads",
                    "--nonblocking", "--gil", "--full-filenames", "--output", str(self.output)]  # fmt: skip
            with self.errors.open("w") as errors:
                self.process = subprocess.Popen(argv, stdout=errors, stderr=subprocess.STDOUT)

    def stop(self) -> dict[str, Any]:
        if self.process is None:
            return {"error": self.missing}
        self.process.send_signal(signal.SIGINT)  # py-spy writes what it has, then exits
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        if not self.output.exists():
            return {"error": "py-spy wrote nothing: " + self.errors.read_text()[-400:].strip()}
        return fold(self.output.read_text().splitlines())


def _frame(text: str) -> tuple[str, str]:
    """``function (path:line)`` -> (function, path)."""
    name, _, where = text.rpartition(" (")
    return (name or text), where.rsplit(":", 1)[0]


def _ours(path: str) -> str | None:
    """The project module a frame's file is (py-spy ``--full-filenames``), or None for libraries and
    the standard library."""
    if not path.startswith("/") or "/site-packages/" in path:
        return None
    try:
        relative = Path(path).relative_to(ROOT)
    except ValueError:
        return None
    return ".".join(relative.with_suffix("").parts)


def _package(path: str) -> str:
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    return "(project)" if _ours(path) else "(python)"


def fold(lines: Iterable[str]) -> dict[str, Any]:
    """py-spy's raw lines (``frame;frame;... count``, outermost first) folded by our functions: each
    function's share of the samples with it on the stack, and with it the innermost of ours."""
    inclusive: Counter[str] = Counter()
    innermost: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    busy = 0
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [frame for each in stack.split(";") if (frame := _frame(each))[1].endswith(".py")]
        if not frames:
            continue
        busy += count
        leaves[_package(frames[-1][1])] += count
        ours = [f"{module}.{name}" for name, path in frames if (module := _ours(path))]
        for each in set(ours):
            inclusive[each] += count
        if ours:
            innermost[ours[-1]] += count
    share = 100 / max(busy, 1)
    return {
        "busy_samples": busy,
        "by_package": {name: n * share for name, n in leaves.most_common(12)},
        "inclusive": {name: n * share for name, n in inclusive.most_common(25)},
        "innermost": {name: n * share for name, n in innermost.most_common(15)},
    }


def render_samples(samples: dict[str, Any]) -> str:
    if "error" in samples:
        return f"  samples        not taken: {samples['error']}"
    lines = [
        f"\nsamples     one worker: {samples['busy_samples']} samples of a thread holding the GIL "
        "(running Python; not waiting on the server, a lock or a sleep); shares of them",
        "  where        " + "  ".join(f"{name} {pct:.0f}%" for name, pct in samples["by_package"].items()),
        "\n| on the stack | innermost of ours | function |\n|---|---|---|",
    ]
    innermost = samples["innermost"]
    for name, pct in samples["inclusive"].items():
        lines.append(f"| {pct:.1f}% | {innermost.get(name, 0.0):.1f}% | `{name}` |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=0)
    parser.add_argument("--idle", type=float, default=0.1)
    parser.add_argument("--lease-ttl", type=float, default=DEFAULT_TTL)
    parser.add_argument("--liveness", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--server-workers", type=int, default=2)
    parser.add_argument("--server-threads", type=int, default=4)
    parser.add_argument("--max-wait", type=float, default=600)
    parser.add_argument("--top", type=int, default=15, help="statements listed, by calls")
    parser.add_argument(
        "--private-cluster",
        action="store_true",
        help="a PostgreSQL of its own with pg_stat_statements (initdb in a temporary directory)",
    )
    parser.add_argument("--sample", action="store_true", help="sample the first worker with py-spy")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second (--sample)")
    add_database_arguments(parser, "bench_profile")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if min(args.tasks, args.workers, args.concurrency) < 1:
        parser.error("--tasks, --workers and --concurrency must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    shared = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    if args.private_cluster:
        with private_cluster(shared) as (server_url, postmaster):
            return run(args, server_url, postmaster)
    return run(args, shared, None)


def run(args: argparse.Namespace, server_url: str, postmaster: int | None) -> int:
    with run_database(server_url, args) as url:
        _make_orders(args.tasks, random.Random(1))
        info = machine_info(url)
        print_machine(info, debug=False)
        with tempfile.TemporaryDirectory(prefix="bench-profile-") as logs_dir:
            logs = Path(logs_dir)
            sandbox_url = with_user(url, SANDBOX_ROLE) if postmaster else url
            server = Server(
                "gunicorn", sandbox_url, logs, workers=args.server_workers, threads=args.server_threads
            )
            try:
                print(f"run         {args.workers} x run_worker --concurrency {args.concurrency}, model "
                      f"{args.latency_ms:g} ms, sandbox {server.description}, database {args.database}"
                      f"{' on a private cluster' if postmaster else ''}\n", flush=True)  # fmt: skip
                result = measure(args, url, server, logs, postmaster)
            finally:
                server.stop()
        print(f"verified    {result['verified']} tasks: completed, chains intact, each step once "
              f"({result['retried']} retried a failed read)\n")  # fmt: skip
        print(render(result))
        if not args.no_save:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"profile-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
            path.write_text(json.dumps({"machine": info, "args": vars(args), "result": result}, indent=2))
            print(f"\nresults     {path.relative_to(ROOT)}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
