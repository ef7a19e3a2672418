"""What a PostgreSQL failover costs the workers: unavailability, stranded tasks, throughput around it.

What it measures
    The ``make cluster-test`` scenario (``tests/cluster/test_failover.py``), run once at size: a
    pg_auto_failover monitor, primary and synchronous secondary on loopback, the API and three
    workers on a multi-host ``DATABASE_URL`` (``target_session_attrs=read-write``), ``--tasks``
    payment tasks (each payment 300 ms at the sandbox), and the primary's node SIGKILLed (keeper and
    postmaster) with one worker, a quarter of the way in. From the audit log on the new primary:

    write_unavailable_s     the primary's death to the first commit on the new primary
    promoted_s              the death to the monitor showing the secondary as primary
    stranded                tasks whose lease was held when the primary died
    all_back_in_progress_s  the death until every stranded task has committed a step again
    tasks_per_s_before / _during / _after
                            completions per second from the first create to the death, from the
                            death until every stranded task moved again, and from then to the end;
                            the ratios during/before and after/before are the figures to compare
                            (the baseline is the same run's "before")
    takeovers               lease takeovers on the record

    The scenario's own checks hold too (each invoice paid once, no acknowledged create lost, the
    API never answering 500): a run that breaks one fails instead of reporting.

How to run
    make bench-cluster                      (installs pg_auto_failover with scripts/ensure-cluster-packages)
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python bench/cluster.py --tasks 200

    DATABASE_URL names the shared server, which keeps only the sandbox's records (pytest-django's
    test database); the formation is made and destroyed in a temporary directory. Results are
    written as JSON to ``bench/results/cluster.json`` unless ``--no-save``.

The same failover under DBOS Transact (``--peer dbos``, part of the default run; ``--peer none``
leaves it out, ``--only-peer`` runs it alone)
    A fresh formation of the same kind; DBOS's system database is the formation's ``durable``
    database, reached on every node (``bench/peers/dbos_pay_invoice.py``: SQLAlchemy wants the hosts
    as repeated ``host`` query parameters, see there). ``--tasks`` ``pay_invoice`` workflows (a POST
    to the same sandbox under the key ``dbos-<workflow id>/pay``, 300 ms each) on one DBOS queue; three
    worker processes with 4 workflows in flight each (our 3 workers x 4 slots). Once a quarter are
    paid and worker 0 has a workflow in flight, the primary's node and worker 0 are SIGKILLed
    together, as in ours. DBOS recovers a dead process's workflows only in a process launched with
    its executor id: when the survivors have done all they will (nothing moved for ``--dbos-grace``
    seconds), a replacement ``worker-0`` is started, as an operator or supervisor would. The figures
    are observed by polling the writer every 0.25 s (DBOS's own timestamps are taken by the client,
    before a commit that may wait out the failover): a step recorded or a workflow finished after
    the kill is a commit, a stranded workflow (PENDING at the kill) moves when its record changes.

    write_unavailable_s, promoted_s, stranded, all_back_in_progress_s, tasks_per_s_*   as ours
    stranded_of_dead_worker     of the stranded, those the killed worker held
    moved_by_survivors          stranded workflows that moved before the replacement started
    survivors_back_s            the kill until every stranded workflow of a surviving worker moved again
    replacement_started_s       the kill until the replacement worker-0 was started (null: none needed)
    paid_twice / sent_again     invoices with two payments at the sandbox / payments sent again under
                                their key (answered with the first)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TEST = "tests/cluster/test_failover.py::test_a_primary_killed_mid_run_pays_nothing_twice_and_loses_nothing"
PEERS = ROOT / "bench" / "peers"
WORKERS, CONCURRENCY = 3, 4  # as tests/cluster/test_failover.py
PAYMENT_MS = 300
POLL = 0.25


def ours(tasks: int) -> dict[str, Any] | None:
    """The product's failover: tests/cluster/test_failover.py once at size; its figures, or None."""
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "cluster.json"
        env = {**os.environ, "CLUSTER_TASKS": str(tasks), "CLUSTER_RESULTS": str(results)}
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-n", "0", "-q", "-m", "cluster", TEST], cwd=ROOT, env=env
        )
        if run.returncode != 0 or not results.exists():
            print(f"bench/cluster.py: the scenario failed (pytest exited {run.returncode})", file=sys.stderr)
            return None
        figures: dict[str, Any] = json.loads(results.read_text())
    return ratios(figures)


def ratios(figures: dict[str, Any]) -> dict[str, Any]:
    before = figures["tasks_per_s_before"] or float("nan")
    figures["during_over_before"] = round(figures["tasks_per_s_during"] / before, 2)
    figures["after_over_before"] = round(figures["tasks_per_s_after"] / before, 2)
    return figures


# --- DBOS Transact on the same failover --------------------------------------------------------------


def sqlalchemy_url(formation: Any) -> str:
    """The formation's nodes as SQLAlchemy spells several hosts (repeated ``host`` query parameters)."""
    hosts = "&".join(f"host=127.0.0.1:{node.port}" for node in formation.nodes)
    return f"postgresql://postgres@/durable?{hosts}&target_session_attrs=read-write&connect_timeout=2"


class DbosFleet:
    """DBOS worker processes (bench/peers/dbos_pay_invoice.py in the peers' venv), each logging to a file."""

    def __init__(self, python: Path, db_url: str, sandbox: str, logs: Path):
        self.python, self.db_url, self.sandbox, self.logs = python, db_url, sandbox, logs
        self.env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.env["PYTHONUNBUFFERED"] = "1"
        self.processes: list[subprocess.Popen[bytes]] = []

    def command(self, mode: str, *extra: str) -> list[str]:
        return [str(self.python), str(PEERS / "dbos_pay_invoice.py"), mode, "--db-url", self.db_url,
                "--concurrency", str(CONCURRENCY), *extra]  # fmt: skip

    def enqueue(self, tasks: int) -> None:
        subprocess.run(self.command("enqueue", "--tasks", str(tasks)), env=self.env, check=True, timeout=300)

    def start(self, index: int) -> subprocess.Popen[bytes]:
        with (self.logs / f"dbos-worker-{index}-{len(self.processes)}.log").open("wb") as out:
            process = subprocess.Popen(
                self.command("worker", "--sandbox-url", self.sandbox, "--index", str(index)),
                env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.processes.append(process)
        return process

    def exited(self, but: subprocess.Popen[bytes] | None = None) -> list[str]:
        return [
            f"pid {p.pid} exited {p.returncode}"
            for p in self.processes
            if p is not but and p.poll() is not None
        ]

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# A workflow's record: its status, its executor, and how many steps it has recorded.
RECORDS = """SELECT w.workflow_uuid, w.status, coalesce(w.executor_id, ''),
                    (SELECT count(*) FROM dbos.operation_outputs o WHERE o.workflow_uuid = w.workflow_uuid)
             FROM dbos.workflow_status w"""


def records(conn: psycopg.Connection) -> dict[str, tuple[str, str, int]]:
    return {row[0]: (row[1], row[2], int(row[3])) for row in conn.execute(RECORDS).fetchall()}


class Watch:
    """The writer's DBOS tables polled every POLL seconds through the multi-host URL (reconnecting)."""

    def __init__(self, dsn: str):
        self.dsn = dsn
        self.conn: psycopg.Connection | None = None

    def read(self) -> dict[str, tuple[str, str, int]] | None:
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2)
            return records(self.conn)
        except psycopg.Error:
            if self.conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self.conn.close()
            self.conn = None
            return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def paid_at_sandbox() -> tuple[Counter[str], int]:
    """Payments at the sandbox by invoice, and how many were sent again under their key."""
    from demo.sandbox.models import Effect

    effects = list(Effect.objects.filter(system="payments"))
    return Counter(e.request.get("invoice") for e in effects), sum(e.deliveries > 1 for e in effects)


def dbos(tasks: int, grace: float) -> dict[str, Any]:
    """DBOS Transact's workers through the same kind of failover; see the module's docstring."""
    from bench.common import DEFAULT_SERVER_URL, run_database
    from bench.peers.harness import ensure_venv

    python = ensure_venv()
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    args = SimpleNamespace(database=f"bench_cluster_dbos_{os.getpid()}", keep_database=False,
                           fresh_migrate=False)  # fmt: skip
    with run_database(server_url, args) as url, tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        from django.db import connections

        from bench.e2e import Server
        from demo.sandbox.models import Fault
        from tests.cluster import autofailover

        Fault.objects.create(system="payments", operation="dispatch", kind="latency", remaining=100_000,
                             params={"ms": PAYMENT_MS})  # fmt: skip
        connections.close_all()
        sandbox = Server("gunicorn", url, Path(tmp), workers=2, threads=8)
        formation = autofailover.create()
        fleet = DbosFleet(python, sqlalchemy_url(formation), sandbox.sandbox, Path(tmp))
        watch = Watch(formation.dsn())
        try:
            return _dbos_run(tasks, grace, formation, fleet, watch)
        except BaseException:
            for log in sorted(Path(tmp).glob("dbos-worker-*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
        finally:
            watch.close()
            fleet.stop()
            formation.destroy()
            sandbox.stop()
            connections.close_all()


def _dbos_run(tasks: int, grace: float, formation: Any, fleet: DbosFleet, watch: Watch) -> dict[str, Any]:
    primary = formation.writer()
    assert primary is not None
    fleet.enqueue(tasks)
    started = time.time()
    victim = fleet.start(0)
    for index in range(1, WORKERS):
        fleet.start(index)

    def wait(predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
            if exited := fleet.exited():
                raise AssertionError(f"a DBOS worker exited before the kill: {exited}")
            time.sleep(0.1)

    wait(lambda: sum(paid_at_sandbox()[0].values()) >= tasks // 4, 300, "a quarter paid")
    with psycopg.connect(formation.dsn(), autocommit=True) as conn:
        # The moment: the worker beside the primary has a workflow in flight.
        held = "SELECT 1 FROM dbos.workflow_status WHERE status = 'PENDING' AND executor_id = 'worker-0'"
        wait(lambda: conn.execute(held).fetchone() is not None, 60, "worker-0 to have a workflow in flight")
        at_kill = records(conn)
    killed = time.time()
    primary.kill()
    victim.kill()
    victim.wait(timeout=30)
    stranded = {w for w, (status, _, _) in at_kill.items() if status == "PENDING"}
    of_victim = {w for w in stranded if at_kill[w][1] == "worker-0"}
    promoted: float | None = None
    first_commit: float | None = None
    moved: dict[str, float] = {}
    done_at: dict[str, float] = {w: 0.0 for w, rec in at_kill.items() if rec[0] == "SUCCESS"}
    replacement: float | None = None
    last_change, previous = time.time(), at_kill
    survivors_exited: list[str] = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        time.sleep(POLL)
        now = time.time()
        if promoted is None and (writer := formation.writer()) is not None and writer is not primary:
            promoted = now - killed
        survivors_exited = survivors_exited or fleet.exited(but=victim)
        current = watch.read()
        if current is None:
            continue
        changed = {w for w, rec in current.items() if rec != previous.get(w)}
        if changed:
            last_change, previous = now, current
        since_kill = {w for w, rec in current.items() if rec != at_kill.get(w)}
        if since_kill and first_commit is None:
            first_commit = now
        for w in since_kill & stranded:
            moved.setdefault(w, now)
        for w, rec in current.items():
            if rec[0] == "SUCCESS":
                done_at.setdefault(w, now)
        if len(done_at) == tasks:
            break
        if replacement is None and now - last_change > grace and first_commit is not None:
            replacement = now  # the survivors have done what they will: start worker-0 again
            print(f"bench/cluster.py: DBOS: {tasks - len(done_at)} workflows stuck for {grace:g} s; "
                  "starting a replacement worker-0", file=sys.stderr, flush=True)  # fmt: skip
            fleet.start(0)
    else:
        raise AssertionError(f"DBOS: {tasks - len(done_at)} workflows unfinished 600 s after the kill")
    back = max(moved.values(), default=first_commit or killed)
    with psycopg.connect(formation.dsn(), autocommit=True) as conn:
        finished = dict(conn.execute(
            "SELECT workflow_uuid, (completed_at / 1000.0)::float8 FROM dbos.workflow_status"
            " WHERE status = 'SUCCESS'"
        ).fetchall())  # fmt: skip
        outputs = conn.execute(
            "SELECT count(*) FROM dbos.workflow_status WHERE status <> 'SUCCESS'"
        ).fetchone()
    payments, sent_again = paid_at_sandbox()
    # Completion times: DBOS's own (client clock) before the kill; after it, when the poll first saw them.
    times = sorted(finished[w] if at == 0.0 else at for w, at in done_at.items())
    first_done = min(at for at in times if at > started)

    def rate(start: float, stop: float) -> float:
        return round(sum(start < at <= stop for at in times) / max(stop - start, 1e-9), 2)

    figures = {
        "peer": "dbos",
        "tasks": tasks,
        "promoted_s": round(promoted, 2) if promoted is not None else None,
        "write_unavailable_s": round((first_commit or killed) - killed, 2),
        "stranded": len(stranded),
        "stranded_of_dead_worker": len(of_victim),
        "moved_by_survivors": sum(1 for w, at in moved.items() if replacement is None or at < replacement),
        "survivors_back_s": round(
            max((at for w, at in moved.items() if w not in of_victim), default=killed) - killed, 2
        ),  # fmt: skip
        "replacement_started_s": round(replacement - killed, 2) if replacement is not None else None,
        "all_back_in_progress_s": round(back - killed, 2),
        "tasks_per_s_before": rate(first_done - 1e-6, killed),
        "tasks_per_s_during": rate(killed, back),
        "tasks_per_s_after": rate(back, times[-1]),
        "paid_twice": sum(n > 1 for n in payments.values()),
        "unpaid": tasks - len(payments),
        "sent_again": sent_again,
        "unfinished": int(outputs[0]) if outputs else 0,  # type: ignore[index]
        "survivors_exited": survivors_exited,
        "poll_s": POLL,
    }
    return ratios(figures)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--peer", choices=("dbos", "none"), default="dbos",
                        help="also run the same failover under this peer (default dbos)")  # fmt: skip
    parser.add_argument("--only-peer", action="store_true", help="run the peer alone, not ours")
    parser.add_argument("--dbos-grace", type=float, default=20.0,
                        help="seconds without progress before a replacement worker-0 is started")  # fmt: skip
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {"loadavg_at_start": [round(x, 2) for x in os.getloadavg()]}
    code = 0
    if not args.only_peer:
        result = ours(args.tasks)
        if result is None:
            code = 1
        else:
            figures |= result
    if args.peer == "dbos":
        figures["loadavg_before_peer"] = [round(x, 2) for x in os.getloadavg()]
        figures["dbos"] = dbos(args.tasks, args.dbos_grace)
    figures["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(figures, indent=2))
    if not args.no_save and code == 0:
        out = ROOT / "bench" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "cluster.json").write_text(json.dumps(figures, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
