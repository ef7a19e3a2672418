"""One measured DBOS Transact run of ``order_lookup`` (see dbos_order_lookup.py); prints one JSON line.

Runs in ``bench/peers/.venv``. Steps:

1. drop and create the database ``bench_peers_dbos`` on ``--server-url`` (DBOS's system database);
2. enqueue ``--tasks`` workflows (``dbos_order_lookup.py enqueue``: also creates DBOS's tables);
3. start ``--processes`` workers (``dbos_order_lookup.py worker``), ``--concurrency`` workflows
   in flight each, the model turn waiting ``--latency-ms``;
4. wait until every workflow is SUCCESS (any ERROR, a dead worker, or ``--timeout`` fails the run);
5. verify each: exactly three steps recorded, outcome = the sandbox record's status and summary;
6. stop the workers (SIGTERM, SIGKILL after a grace), drop the database, print the JSON.

busy_s runs from the first step's start to the last workflow's completion, both as DBOS records them
in its system tables (``operation_outputs.started_at_epoch_ms``, ``workflow_status.completed_at``),
so worker start-up is left out; wall_s (workers started -> all done seen) includes it.
Diagnostics go to stderr; stdout carries the JSON only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "dbos_order_lookup.py"
DATABASE = f"bench_peers_dbos_{os.getpid()}"  # DBOS's system database, one per run; --database names another
STEPS = 3
GRACE = 10.0
POLL = 0.1


def log(message: str) -> None:
    print(f"[run_dbos] {message}", file=sys.stderr, flush=True)


def database_url(server_url: str, dbname: str) -> str:
    """The server URL pointed at ``dbname``, with the ``postgresql://`` scheme SQLAlchemy wants."""
    parts = urlsplit(server_url)
    scheme = "postgresql" if parts.scheme in ("postgres", "postgresql") else parts.scheme
    return urlunsplit(parts._replace(scheme=scheme, path=f"/{dbname}"))


def recreate_database(server_url: str, *, create: bool) -> None:
    """Create DATABASE afresh, or drop it at the end. Before creating, an idle one of that name is dropped
    without FORCE (PostgreSQL refuses while another run uses it); only the one this run created is
    dropped WITH (FORCE) at the end, past its workers' lingering sessions."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        force = sql.SQL("") if create else sql.SQL(" WITH (FORCE)")
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(DATABASE), force))
        if create:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))


class Workers:
    """The worker processes. ``start`` fills ``processes`` one by one, so ``stop`` stops whatever started."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.processes: list[subprocess.Popen] = []

    def start(self, args: argparse.Namespace, db_url: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for index in range(args.processes):
            with (self.logs / f"worker-{index}.log").open("w") as out:
                command = [
                    sys.executable, str(SCRIPT), "worker", "--db-url", db_url,
                    "--sandbox-url", args.sandbox_url, "--concurrency", str(args.concurrency),
                    "--latency-ms", str(args.latency_ms), "--polling-interval", str(args.polling_interval),
                    "--index", str(index),
                ]  # fmt: skip
                self.processes.append(
                    subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=HERE)
                )

    def check_alive(self) -> None:
        for index, process in enumerate(self.processes):
            if process.poll() is not None:
                raise RuntimeError(
                    f"worker {index} exited with {process.returncode}:\n{self.log_tail(index)}"
                )

    def log_tail(self, index: int, lines: int = 30) -> str:
        text = (self.logs / f"worker-{index}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        for process in self.processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log(f"worker pid {process.pid} ignored SIGTERM for {GRACE:g} s: SIGKILL")
                process.kill()
                process.wait()


class ConnectionSampler(threading.Thread):
    """The peak number of server sessions on the DBOS database while the workers run."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.done.wait(0.2):
                (count,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    (DATABASE,),
                ).fetchone()  # type: ignore[misc]
                self.peak = max(self.peak, count)


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM dbos.workflow_status GROUP BY status").fetchall())


def wait_all_done(conn: psycopg.Connection, tasks: int, workers: Workers, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last_report = time.monotonic()
    while True:
        counts = status_counts(conn)
        if counts.get("SUCCESS", 0) == tasks:
            return
        failed = {k: v for k, v in counts.items() if k not in ("SUCCESS", "PENDING", "ENQUEUED")}
        if failed:
            raise RuntimeError(f"workflows ended badly: {counts}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {tasks} workflows succeeded within {timeout:g} s: {counts}")
        workers.check_alive()
        if time.monotonic() - last_report > 5:
            log(f"progress {counts}")
            last_report = time.monotonic()
        time.sleep(POLL)


def busy_span(conn: psycopg.Connection) -> float:
    first, last = conn.execute(
        "SELECT (SELECT min(started_at_epoch_ms) FROM dbos.operation_outputs),"
        "       (SELECT max(completed_at) FROM dbos.workflow_status WHERE status = 'SUCCESS')"
    ).fetchone()  # type: ignore[misc]
    if first is None or last is None:
        raise RuntimeError(f"DBOS recorded no step start ({first}) or completion ({last})")
    return (last - first) / 1000


def verify(conn: psycopg.Connection, db_url: str, args: argparse.Namespace) -> int:
    """Every workflow: three steps recorded once each, the outcome the sandbox record implies."""
    from dbos import DBOSClient

    steps = dict(conn.execute(
        "SELECT workflow_uuid, count(*) FROM dbos.operation_outputs GROUP BY workflow_uuid"
    ).fetchall())  # fmt: skip
    client = DBOSClient(system_database_url=db_url, application_name="bench_peers_order_lookup")
    try:
        workflows = client.list_workflows(load_input=False, load_output=True)
    finally:
        client.destroy()
    expected_ids = {f"E-{i}" for i in range(args.tasks)}
    seen = {w.workflow_id for w in workflows}
    if seen != expected_ids:
        raise AssertionError(f"workflow ids differ: missing {sorted(expected_ids - seen)[:5]}, "
                             f"extra {sorted(seen - expected_ids)[:5]}")  # fmt: skip
    failed = 0
    sandbox_auth = {"Authorization": f"Bearer {os.environ.get('SANDBOX_TOKEN', '')}"}  # the bench's sandbox
    with httpx.Client(timeout=10, headers=sandbox_auth) as http:
        for workflow in workflows:
            order_id = workflow.workflow_id
            record = http.get(f"{args.sandbox_url.rstrip('/')}/orders/records/{order_id}")
            record.raise_for_status()
            status = record.json()["data"]["status"]
            expected = {
                "order_id": order_id,
                "order_status": status,
                "summary": f"order {order_id} is {status}",
            }
            problems = []
            if workflow.status != "SUCCESS":
                problems.append(f"status {workflow.status}")
            if workflow.output != expected:
                problems.append(f"outcome {workflow.output!r}, expected {expected!r}")
            if steps.get(order_id) != STEPS:
                problems.append(f"{steps.get(order_id)} steps recorded")
            if problems:
                failed += 1
                if failed <= 5:
                    log(f"workflow {order_id}: {'; '.join(problems)}")
    return failed


def run(args: argparse.Namespace) -> dict[str, Any]:
    loadavg = [round(x, 2) for x in os.getloadavg()]
    db_url = database_url(args.server_url, DATABASE)
    recreate_database(args.server_url, create=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-peers-dbos-") as logs_dir:
            logs = Path(logs_dir)
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, str(SCRIPT), "enqueue", "--db-url", db_url, "--tasks", str(args.tasks),
                 "--concurrency", str(args.concurrency), "--polling-interval", str(args.polling_interval)],
                capture_output=True, text=True, cwd=HERE, timeout=args.timeout,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(
                    f"enqueue failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}"
                )
            enqueue_s = time.perf_counter() - started
            log(f"enqueued {args.tasks} workflows in {enqueue_s:.2f} s (DBOS set-up included)")
            with psycopg.connect(db_url, autocommit=True) as conn:
                conn.execute("VACUUM ANALYZE")
                sampler = ConnectionSampler(db_url)
                sampler.start()
                started = time.perf_counter()
                workers = Workers(logs)
                try:
                    workers.start(args, db_url)
                    wait_all_done(conn, args.tasks, workers, args.timeout)
                    wall = time.perf_counter() - started
                finally:
                    sampler.done.set()
                    workers.stop()
                    sampler.join(timeout=5)
                    if args.show_worker_logs:
                        for index in range(args.processes):
                            log(f"worker {index} log:\n{workers.log_tail(index, 200)}")
                busy = busy_span(conn)
                failed = verify(conn, db_url, args)
        log(f"all {args.tasks} done {wall:.2f} s after the workers started, {busy:.2f} s busy; "
            f"peak {sampler.peak} sessions on {DATABASE}")  # fmt: skip
    finally:
        recreate_database(args.server_url, create=False)
    return {
        "peer": "dbos",
        "dbos_version": version("dbos"),
        "tasks": args.tasks,
        "processes": args.processes,
        "concurrency": args.concurrency,
        "latency_ms": args.latency_ms,
        "polling_interval_s": args.polling_interval,
        "busy_s": round(busy, 4),
        "wall_s": round(wall, 4),
        "workflows_per_s": round(args.tasks / busy, 3),
        "steps_per_s": round(STEPS * args.tasks / busy, 3),
        "db_connections_peak": sampler.peak,
        "failed": failed,
        "loadavg_at_start": loadavg,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument(
        "--server-url", required=True, help="a PostgreSQL server URL (its database is ignored)"
    )
    parser.add_argument(
        "--sandbox-url", required=True, help="the sandbox's base URL, e.g. http://127.0.0.1:PORT/sandbox"
    )
    parser.add_argument("--database", default=DATABASE, help="the throwaway database to create and drop")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1, help="workflows in flight per process")
    parser.add_argument("--latency-ms", type=int, default=0, help="the scripted model's wait per turn")
    parser.add_argument("--polling-interval", type=float, default=0.1,
                        help="seconds between a worker's dequeue polls (DBOS's default: 1.0)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600, help="give up when the work takes longer")
    parser.add_argument("--show-worker-logs", action="store_true", help="copy the workers' logs to stderr")
    args = parser.parse_args(argv)
    if min(args.tasks, args.processes, args.concurrency) < 1 or args.latency_ms < 0:
        parser.error("--tasks, --processes and --concurrency must be positive, --latency-ms not negative")
    return args


class Terminated(Exception):
    """SIGTERM (the harness giving up): unwind, so the workers stop and the database is dropped."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    global DATABASE
    args = parse_args(argv)
    DATABASE = args.database
    signal.signal(signal.SIGTERM, _terminated)
    try:
        result = run(args)
    except Exception as exc:  # noqa: BLE001 - the harness reads the reason from stderr
        log(f"FAILED: {type(exc).__name__}: {exc}")
        return 1
    print(json.dumps(result), flush=True)
    return 0 if result["failed"] == 0 else 2


if __name__ == "__main__":
    sys.exit(main())
