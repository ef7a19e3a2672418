"""End to end: worker processes, the sandbox over HTTP and PostgreSQL, for throughput and crash recovery.

What it measures
    throughput  ``--tasks`` ``order_lookup`` tasks (read the order from the sandbox's orders system
                over HTTP, a scripted model turn of ``--latency-ms``, complete: one HTTP GET and three
                worker transitions each) run by ``--workers`` ``manage.py run_worker`` processes with
                ``--concurrency`` tasks in flight each. Tasks per second from the first worker commit
                to the last completion (worker start-up excluded; the wall time including it is shown
                too), and how long one worker spends per task (the gap between two of its completions
                in a row), p50/p99.
    recovery    ``--recovery-tasks`` tasks, ``--workers`` victims and as many survivors working side by
                side, lease TTL ``--lease-ttl``. Once ``--kill-after`` of the tasks are done, every
                victim is SIGKILLed; the tasks whose lease a victim held are *stranded*. A task is
                *back in progress* when a survivor holds its lease or it is terminal. Reported: the
                time from the kill until every stranded task is back in progress, until a survivor's
                first commit on one, and until all tasks are done. With ``--liveness`` (the default)
                claimers see a killed worker's liveness lock gone at once; ``--no-liveness`` shows the
                TTL fallback.
    peers       with ``--peers``, the same throughput work run by DBOS Transact (``bench/peers``; its
                own virtualenv) against the same PostgreSQL server and sandbox, with the same number
                of processes and tasks in flight, and the ratio ours/DBOS.
    pgbench     with ``--pgbench-seconds S``, after the throughput run: the database's own commit rate
                for a transaction shaped like one of our transitions (an UPDATE of one row, two
                INSERTs), ``pgbench`` at the sessions the workers commit through at once, for S
                seconds, on throwaway tables in the run's database; and our commits/s (tasks/s x the
                transitions the workers committed per task) over it.
    backlog     with ``--backlog N``, instead of the throughput run: N runnable tasks queued before the
                workers start (those the workers can reach through ``task_create``, the rest copies
                of a task's row behind them: ``measure_backlog``), tasks/s over the first
                ``--backlog-measure`` completions, then the workers are stopped.
    memory      every run samples each worker's resident set (``VmRSS``) while it runs; the highest.

    The sandbox is served by gunicorn (``--server gunicorn``, the default; ``runserver`` is the
    alternative) on a free port, against the benchmark database; workers find it through
    ``SANDBOX_BASE_URL``. Workers run with ``--sweep``, as deployed: a read that failed (a reset
    connection under load) waits in ``waiting_retry`` for the sweep; ``--no-sweep`` leaves it out.
    Everything runs with DEBUG off.

    Afterwards every task is checked: completed, the outcome's order status is the record's, its
    audit chain verifies, and no step committed twice: exactly four events (start + three steps),
    besides the documented retry of a failed read (``attempt_failed`` for ``evidence_unavailable``,
    ``backoff_elapsed``, ``proceed``/``refresh``), which is accepted and counted (``check_events``).

How to run
    make bench-e2e                     # DATABASE_URL defaults to the local server
    .venv/bin/python bench/e2e.py --tasks 2000 --recovery-tasks 1000 --lease-ttl 5

    DATABASE_URL names the *server*; the script creates its own database (``--database``, default
    ``bench_e2e_<pid>_<hex>``), copied from the migrated template, and drops it at the end. Results
    are also written as JSON to ``bench/results/`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/e2e.py` puts bench/ first, not the project

from bench.common import (  # noqa: E402
    BENCH_ENV,
    DEFAULT_SERVER_URL,
    RESULTS_DIR,
    SERVER_START_TIMEOUT,
    add_database_arguments,
    add_smoke_argument,
    machine_info,
    print_machine,
    run_database,
    settle,
)

DEFAULT_TTL = 30.0  # settings.LEASE_TTL_SECONDS's default
POLL = 0.05
ORDER_STATUSES = ("delivered", "shipped", "processing", "returned")


# ---------------------------------------------------------------------------
# Processes: the sandbox server and the workers
# ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child_env(url: str, sandbox_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": url,
        "DEBUG": "0",
        **{name: os.environ.get(name, value) for name, value in BENCH_ENV.items()},  # secrets and keys
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "SECURE_SSL_REDIRECT": "0",  # the sandbox is plain HTTP on loopback
        "CELERY_BROKER_URL": "memory://",  # workers poll PostgreSQL; no doorbell reaches a real broker
        "SANDBOX_BASE_URL": sandbox_url,
        "SANDBOX_ENABLED": "1",  # off by default with DEBUG off; this server is the bench's own sandbox
        "LOG_LEVEL": "ERROR",
    }


class Server:
    """The sandbox (the whole project's WSGI app) in its own process on a free port."""

    def __init__(self, kind: str, url: str, logs: Path, *, workers: int, threads: int):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        if kind == "gunicorn":
            command = [
                sys.executable, "-m", "gunicorn", "config.wsgi:application",
                "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers), "--threads", str(threads),
                "--worker-class", "gthread", "--log-level", "warning",
            ]  # fmt: skip
        else:
            command = [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"]
        self.description = f"{kind}" + (
            f" ({workers} processes x {threads} threads)" if kind == "gunicorn" else ""
        )
        self.log = (logs / "server.log").open("w")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=_child_env(url, self.sandbox), stdout=self.log, stderr=subprocess.STDOUT
        )
        try:
            self._wait_ready(timeout=SERVER_START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the sandbox server exited: {Path(self.log.name).read_text()[-2000:]}")
            try:
                httpx.get(f"{self.sandbox}/orders/records/ping", timeout=1)  # any answer will do
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the sandbox server did not answer within {timeout:g} s")

    @property
    def sandbox(self) -> str:
        return f"{self.base}/sandbox"

    def stop(self) -> None:
        _terminate(self.process)
        self.log.close()


def _terminate(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class Workers:
    """``count`` ``manage.py run_worker`` processes; their ids are ``host:pid`` as the workers say.

    ``program`` is what runs ``run_worker``: ``manage.py``, or a bench script that registers a task
    type of its own first (``bench/sdk_agents.py --worker``)."""

    def __init__(
        self,
        count: int,
        url: str,
        sandbox: str,
        logs: Path,
        args: argparse.Namespace,
        ttl: float,
        *,
        program: Sequence[str] = ("manage.py",),
    ):
        command = [
            sys.executable, *program, "run_worker", "--concurrency", str(args.concurrency),
            "--idle", str(args.idle), "--lease-ttl", str(ttl), *(["--sweep"] if args.sweep else []),
        ]  # fmt: skip
        env = {
            **_child_env(url, sandbox),
            "MODEL_LATENCY_MS": str(args.latency_ms),
            "WORKER_LIVENESS": "1" if args.liveness else "0",
        }
        self.processes = []
        self.logs: list[Path] = []
        for _ in range(count):
            self.logs.append(logs / f"worker-{time.monotonic_ns()}.log")
            log = self.logs[-1].open("w")
            self.processes.append(
                subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
            log.close()
        host = socket.gethostname()
        self.ids = {f"{host}:{p.pid}" for p in self.processes}

    def kill(self) -> None:
        for process in self.processes:
            os.kill(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=10)

    def stop(self) -> None:
        for process in self.processes:  # all asked at once: each winds down while the others do
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            _terminate(process)

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(
            f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-lines:]) for path in self.logs
        )

    def check_alive(self) -> None:
        dead = [p.pid for p in self.processes if p.poll() is not None]
        if dead:
            raise RuntimeError(f"worker(s) {dead} exited on their own; see the logs")


# ---------------------------------------------------------------------------
# Tasks, checks and timings (in this process, through Django)
# ---------------------------------------------------------------------------


def _make_orders(count: int, rng: random.Random) -> None:
    from demo.sandbox.models import Record

    Record.objects.bulk_create(
        Record(system="orders", record_id=f"E-{i}", data={"status": rng.choice(ORDER_STATUSES)})
        for i in range(count)
    )


def _make_tasks(tenant_slug: str, count: int) -> tuple[Any, float]:
    """Start ``count`` ``order_lookup`` tasks in a tenant of their own; return it and the seconds it took."""
    from tasks.services import task_create
    from tasks.transitions import Actor
    from tenancy.models import Tenant

    tenant = Tenant.objects.create(slug=tenant_slug, name=tenant_slug)
    actor = Actor.system("bench")
    started = time.perf_counter()
    for i in range(count):
        task_create(
            tenant=tenant,
            task_type="order_lookup",
            objective=f"Look up E-{i}",
            input={"order_id": f"E-{i}"},
            actor=actor,
        )
    return tenant, time.perf_counter() - started


def _not_done(tenant: Any) -> int:
    from tasks.models import Task
    from tasks.states import TERMINAL

    return Task.objects.filter(tenant=tenant).exclude(state__in=TERMINAL).count()


def _wait_all_done(tenant: Any, workers: Workers, max_wait: float) -> None:
    from tasks.models import Task
    from tasks.states import TERMINAL

    deadline = time.monotonic() + max_wait
    while _not_done(tenant):
        if time.monotonic() > deadline:
            stuck = Task.objects.filter(tenant=tenant).exclude(state__in=TERMINAL).select_related("lease")[:5]
            described = "\n".join(
                f"  {t.id} {t.state} v{t.state_version} {t.state_reason}: {getattr(t, 'lease', None)}"
                for t in stuck
            )
            raise RuntimeError(
                f"{_not_done(tenant)} tasks still not done after {max_wait:g} s, e.g.\n{described}\n"
                f"worker logs:\n{workers.log_tails()}"
            )
        workers.check_alive()
        time.sleep(POLL)


# One order_lookup, run once: created, the evidence read (a step), the model's turn (a step), done.
ONCE = ("start", "step", "step", "complete")
# The retry this bench documents: a read that failed under load (a reset connection) waits in
# waiting_retry; the sweep's backoff_elapsed moves it to resume_validation, where a worker goes on
# (proceed, or refresh: the evidence read again) or the read fails again. Nothing else is accepted.
RETRY_CODES = frozenset({"evidence_unavailable"})
RESUMED = frozenset({"proceed", "refresh"})
# Where a task the workers were stopped before it ended may be: runnable, or waiting out the retry.
UNFINISHED = frozenset({"ready", "resume_validation", "waiting_retry"})


def check_events(events: Sequence[tuple[int, str, str, str, str]], *, whole: bool = True) -> str | None:
    """What is wrong with one order_lookup task's transitions, or None when they are its one run.

    ``events`` are ``(state_version, from_state, to_state, trigger, reason_code)``. Accepted: versions
    1..n in a row, and once every documented retry detour (``attempt_failed`` to ``waiting_retry``
    for ``evidence_unavailable``, ``backoff_elapsed``, then ``proceed``/``refresh`` back to ``ready``
    or the read failing again) is taken out, exactly ``ONCE``: no step committed twice, no other
    transition. A retried read commits no step, so its effect (the step) still happens once.

    ``whole=False``: a task the workers stopped before it ended (the backlog run stops them after a
    number of completions): its transitions so far must be the beginning of that run (a prefix of
    ``ONCE``, a retry under way accepted)."""
    versions = [e[0] for e in events]
    if versions != list(range(1, len(events) + 1)):
        return f"event versions {versions} are not 1..{len(events)} in a row"
    once: list[str] = []
    expecting = "run"  # run: the task's own transitions; waiting: backoff_elapsed; validating: resume
    for version, source, target, trigger, code in events:
        if expecting == "waiting":
            if (source, target, trigger) != ("waiting_retry", "resume_validation", "backoff_elapsed"):
                return f"v{version} {trigger} ({source} -> {target}) where the retry's backoff_elapsed is"
            expecting = "validating"
        elif trigger == "attempt_failed" and target == "waiting_retry" and expecting in ("run", "validating"):
            if code not in RETRY_CODES or source != ("ready" if expecting == "run" else "resume_validation"):
                why = code or "no reason code"
                return f"v{version} attempt_failed ({why}) from {source}: not the documented retry"
            expecting = "waiting"
        elif expecting == "validating":
            if (source, target) != ("resume_validation", "ready") or trigger not in RESUMED:
                return f"v{version} {trigger} ({source} -> {target}) where the retry resumes"
            expecting = "run"
        else:
            once.append(trigger)
    if not whole:
        if tuple(once) != ONCE[: len(once)] or len(once) == len(ONCE):
            return f"transitions {once} besides the retries are not the beginning of {list(ONCE)}"
        return None
    if expecting != "run":
        return f"ends mid-retry ({expecting})"
    if tuple(once) != ONCE:
        return (
            f"transitions {once} besides the retries, expected {list(ONCE)}: a step committed twice "
            "or another path"
        )
    return None


def _verify(tenant: Any, *, stopped: bool = False) -> tuple[int, int]:
    """Every task: completed, the record's status in its outcome, chain intact, each step committed once
    (``check_events``: a documented retry of a failed read is accepted, nothing else). Returns how many
    tasks were checked and how many of them were retried.

    ``stopped``: the workers were stopped before every task ended (the backlog run); a task not
    completed must still be runnable (or waiting out the documented retry), its chain intact, its
    transitions the beginning of its one run."""
    from audit.models import TransitionEvent
    from audit.verify import verify_task
    from demo.sandbox.models import Record
    from tasks.models import Task

    statuses = dict(Record.objects.filter(system="orders").values_list("record_id", "data__status"))
    events: dict[Any, list[tuple[int, str, str, str, str]]] = {}
    for task_id, *event in (
        TransitionEvent.objects.filter(tenant=tenant)
        .order_by("task_id", "state_version")
        .values_list("task_id", "state_version", "from_state", "to_state", "trigger", "reason_code")
    ):
        events.setdefault(task_id, []).append(tuple(event))  # type: ignore[arg-type]
    checked = retried = 0
    for task in Task.objects.filter(tenant=tenant):
        if stopped and task.state in UNFINISHED:
            chain = events.get(task.id, [])
            if broken := verify_task(task):
                raise AssertionError(f"audit chain broken: {broken}")
            if problem := check_events(chain, whole=False):
                raise AssertionError(f"task {task.id} (left {task.state}) has {len(chain)} events: {problem}")
            if task.state_version != len(chain):
                raise AssertionError(f"task {task.id} at v{task.state_version} with {len(chain)} events")
            checked += 1
            continue
        if task.state != "completed":
            raise AssertionError(f"task {task.id} ended {task.state} ({task.state_reason})")
        if task.outcome["order_status"] != statuses[task.input["order_id"]]:
            raise AssertionError(f"task {task.id} reported {task.outcome}")
        if broken := verify_task(task):
            raise AssertionError(f"audit chain broken: {broken}")
        chain = events.get(task.id, [])
        if problem := check_events(chain):
            raise AssertionError(f"task {task.id} has {len(chain)} events: {problem}")
        if task.state_version != len(chain):
            raise AssertionError(f"task {task.id} at v{task.state_version} with {len(chain)} events")
        checked += 1
        retried += len(chain) > len(ONCE)
    return checked, retried


def _busy_span(tenant: Any) -> tuple[float, list[float]]:
    """Seconds from the first worker commit to the last completion, and each worker's time per task.

    A worker's time per task is the gap between two completions in a row by that worker: the claim,
    the evidence read over HTTP, the model turn and three commits, with nothing left out.
    """
    from audit.models import TransitionEvent

    rows = list(
        TransitionEvent.objects.filter(tenant=tenant, actor_kind="worker")
        .order_by("created_at")
        .values_list("actor_id", "trigger", "created_at")
    )
    by_worker: dict[str, list[datetime]] = {}
    for actor_id, trigger, at in rows:
        if trigger == "complete":
            by_worker.setdefault(actor_id, []).append(at)
    gaps = [
        (later - earlier).total_seconds() * 1000
        for done in by_worker.values()
        for earlier, later in zip(done, done[1:], strict=False)
    ]
    return (rows[-1][2] - rows[0][2]).total_seconds(), gaps


def _worker_commits(tenant: Any) -> int:
    """The transitions the workers committed (three per task, more for a retried read): each one
    transaction of a fenced UPDATE of the task and the INSERTs of its event and checkpoint."""
    from audit.models import TransitionEvent

    return TransitionEvent.objects.filter(tenant=tenant, actor_kind="worker").count()


def _quantiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100)
    return cuts[49], cuts[98]


# ---------------------------------------------------------------------------
# The two measurements
# ---------------------------------------------------------------------------


@dataclass
class Throughput:
    tasks: int
    workers: int
    concurrency: int
    latency_ms: float
    lease_ttl_s: float
    create_s: float
    wall_s: float  # workers started -> all done, start-up included
    busy_s: float  # first worker commit -> last completion
    tasks_per_s: float
    transitions_per_s: float
    per_task_p50_ms: float  # one worker's time per task (between its completions)
    per_task_p99_ms: float
    retried: int = 0  # tasks whose read failed and was retried (accepted by check_events)
    commits_per_task: float = 3.0  # transitions the workers committed per task (3; a retry adds some)
    commits_per_s: float = 0.0  # tasks/s x commits per task: the transactions pgbench is compared with
    worker_rss_mb: list[float] = field(default_factory=list)  # each worker's peak VmRSS while it ran


class RssSampler(threading.Thread):
    """Each worker process's resident set size (``VmRSS`` in ``/proc/<pid>/status``), sampled every
    ``every`` seconds while the workers run; ``peaks_mb`` is each one's highest, in MB (MiB)."""

    def __init__(self, workers: Workers, every: float = 0.2):
        super().__init__(daemon=True, name="rss-sampler")
        self.pids = [p.pid for p in workers.processes]
        self.every = every
        self.peak_kb = dict.fromkeys(self.pids, 0)
        self.stopped = threading.Event()

    @staticmethod
    def rss_kb(pid: int) -> int:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # exited, or no /proc (not Linux): nothing to add
            return 0
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return int(found.group(1)) if found else 0

    def run(self) -> None:
        while not self.stopped.wait(self.every):
            self.sample()

    def sample(self) -> None:
        for pid in self.pids:
            self.peak_kb[pid] = max(self.peak_kb[pid], self.rss_kb(pid))

    def __enter__(self) -> RssSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.join()

    @property
    def peaks_mb(self) -> list[float]:
        return [round(self.peak_kb[pid] / 1024, 1) for pid in self.pids if self.peak_kb[pid]]


def measure_throughput(args: argparse.Namespace, url: str, server: Server, logs: Path) -> Throughput:
    from django.db import connections

    tenant, create_s = _make_tasks("bench-throughput", args.tasks)
    connections.close_all()
    settle(url, smoke=args.smoke)
    started = time.monotonic()
    workers = Workers(args.workers, url, server.sandbox, logs, args, args.lease_ttl)
    try:
        with RssSampler(workers) as rss:
            _wait_all_done(tenant, workers, args.max_wait)
            rss.sample()  # the last moment every worker still holds what it grew to
        wall = time.monotonic() - started
    finally:
        workers.stop()
    busy, per_task = _busy_span(tenant)
    commits = _worker_commits(tenant)
    p50, p99 = _quantiles(per_task)
    _, retried = _verify(tenant)
    return Throughput(
        tasks=args.tasks,
        workers=args.workers,
        concurrency=args.concurrency,
        latency_ms=args.latency_ms,
        lease_ttl_s=args.lease_ttl,
        create_s=create_s,
        wall_s=wall,
        busy_s=busy,
        tasks_per_s=args.tasks / busy,
        transitions_per_s=3 * args.tasks / busy,
        per_task_p50_ms=p50,
        per_task_p99_ms=p99,
        retried=retried,
        commits_per_task=commits / args.tasks,
        commits_per_s=commits / busy,
        worker_rss_mb=rss.peaks_mb,
    )


@dataclass
class Recovery:
    tasks: int
    workers: int  # killed, and as many survivors
    lease_ttl_s: float
    liveness: bool
    done_at_kill: int
    leased_at_kill: int  # live leases the killed workers held: the stranded tasks
    back_in_progress_s: float  # kill -> every stranded task leased by a survivor, or terminal
    first_commit_s: float  # kill -> a survivor's first commit on a stranded task
    all_done_s: float  # kill -> every task done
    retried: int = 0  # tasks whose read failed and was retried (accepted by check_events)


def measure_recovery(args: argparse.Namespace, url: str, server: Server, logs: Path) -> Recovery:
    """Victims and survivors work side by side; every victim is SIGKILLed at once mid-run.

    What the kill strands (the victims' live leases) must be back in a survivor's hands: with
    liveness on, as soon as the victims' sessions end; with ``--no-liveness``, when the leases lapse.
    """
    from django.db import connections
    from django.utils import timezone

    from audit.models import TransitionEvent
    from tasks.models import Lease, Task
    from tasks.states import TERMINAL

    tenant, _ = _make_tasks("bench-recovery", args.recovery_tasks)
    connections.close_all()
    settle(url, smoke=args.smoke)
    ttl = args.lease_ttl
    victims = Workers(args.workers, url, server.sandbox, logs, args, ttl)
    survivors = Workers(args.workers, url, server.sandbox, logs, args, ttl)
    kill_at_done = int(args.recovery_tasks * args.kill_after)
    deadline = time.monotonic() + args.max_wait
    try:
        try:
            while True:
                done = args.recovery_tasks - _not_done(tenant)
                held = Lease.objects.filter(
                    task__tenant=tenant, worker_id__in=victims.ids, expires_at__gt=timezone.now()
                ).exists()
                if done >= kill_at_done and held:
                    break
                if time.monotonic() > deadline or done == args.recovery_tasks:
                    raise RuntimeError(
                        "the workers finished (or stalled) before the kill point; use more tasks"
                    )
                victims.check_alive()
                time.sleep(0.01)
            victims.kill()
        except BaseException:
            victims.stop()
            raise
        killed = timezone.now()
        stranded = set(
            Lease.objects.filter(task__tenant=tenant, worker_id__in=victims.ids, expires_at__gt=killed)
            .exclude(task__state__in=TERMINAL)
            .values_list("task_id", flat=True)
        )
        done_at_kill = args.recovery_tasks - _not_done(tenant)
        waiting = set(stranded)
        back_in_progress = 0.0
        while waiting:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(waiting)} stranded tasks never came back")
            terminal = set(
                Task.objects.filter(pk__in=waiting, state__in=TERMINAL).values_list("id", flat=True)
            )
            leased = set(
                Lease.objects.filter(task_id__in=waiting, worker_id__in=survivors.ids).values_list(
                    "task_id", flat=True
                )
            )
            waiting -= terminal | leased
            back_in_progress = (timezone.now() - killed).total_seconds()
            survivors.check_alive()
            time.sleep(POLL / 5)
        _wait_all_done(tenant, survivors, max(deadline - time.monotonic(), 1))
        all_done = (timezone.now() - killed).total_seconds()
    finally:
        survivors.stop()
    first_commit = (
        TransitionEvent.objects.filter(
            task_id__in=stranded, actor_id__in=[f"worker:{w}" for w in survivors.ids], created_at__gt=killed
        )
        .order_by("created_at")
        .values_list("created_at", flat=True)
        .first()
    )
    _, retried = _verify(tenant)
    return Recovery(
        tasks=args.recovery_tasks,
        workers=args.workers,
        lease_ttl_s=ttl,
        liveness=args.liveness,
        done_at_kill=done_at_kill,
        leased_at_kill=len(stranded),
        back_in_progress_s=back_in_progress,
        first_commit_s=(first_commit - killed).total_seconds() if first_commit else float("nan"),
        all_done_s=all_done,
        retried=retried,
    )


# ---------------------------------------------------------------------------
# The database's own commit rate (pgbench) and a backlog queued before the workers start
# ---------------------------------------------------------------------------

PGBENCH_TABLES = """
DROP TABLE IF EXISTS bench_pgbench_task, bench_pgbench_event, bench_pgbench_checkpoint;
CREATE TABLE bench_pgbench_task (
    id integer PRIMARY KEY, state text NOT NULL, state_version integer NOT NULL,
    updated_at timestamptz NOT NULL, facts jsonb NOT NULL);
CREATE TABLE bench_pgbench_event (
    id bigserial PRIMARY KEY, task_id integer NOT NULL, state_version integer NOT NULL,
    created_at timestamptz NOT NULL, payload jsonb NOT NULL);
CREATE INDEX ON bench_pgbench_event (task_id, state_version);
CREATE TABLE bench_pgbench_checkpoint (
    id bigserial PRIMARY KEY, task_id integer NOT NULL, state_version integer NOT NULL,
    created_at timestamptz NOT NULL, payload jsonb NOT NULL);
CREATE INDEX ON bench_pgbench_checkpoint (task_id, state_version);
INSERT INTO bench_pgbench_task SELECT g, 'ready', 1, now(), '{}' FROM generate_series(1, %(rows)s) g;
"""
# One transaction shaped like one of our transitions: the task's row updated, its event and its
# checkpoint inserted, one commit. Statements sent as text (pgbench's default -M simple), as Django
# sends ours.
PGBENCH_SCRIPT = """\\set id random(1, {rows})
BEGIN;
UPDATE bench_pgbench_task SET state_version = state_version + 1, updated_at = now(),
    facts = '{{"order_status": "shipped", "step": "model"}}' WHERE id = :id;
INSERT INTO bench_pgbench_event (task_id, state_version, created_at, payload)
    VALUES (:id, 2, now(), '{{"trigger": "step", "from": "ready", "to": "ready", "reason": "{pad}"}}');
INSERT INTO bench_pgbench_checkpoint (task_id, state_version, created_at, payload)
    VALUES (:id, 2, now(), '{{"step": "model", "facts": {{"order_status": "shipped"}}, "pad": "{pad}"}}');
END;
"""
PGBENCH_TPS = re.compile(r"^tps = ([\d.]+) \(without initial connection time\)", re.MULTILINE)


def pgbench_binary() -> str:
    """``PGBENCH``, else ``pgbench`` on the PATH, else the newest PostgreSQL's (Debian keeps it in
    ``/usr/lib/postgresql/<version>/bin``)."""
    if found := os.environ.get("PGBENCH") or shutil.which("pgbench"):
        return found
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pgbench"), key=lambda p: int(p.parent.parent.name)
    )
    if not installed:
        raise RuntimeError("pgbench not found: install PostgreSQL's client programs or set PGBENCH")
    return str(installed[-1])


def pgbench_clients(workers: int, concurrency: int) -> int:
    """The database sessions a run of ``workers`` x ``concurrency`` commits through at once: each
    worker's slots share its pool (``--db-connections``: ``WORKER_DB_CONNECTIONS``, by default
    min(concurrency, 8) + 2), and no more of them commit at once than there are slots."""
    from django.conf import settings

    pool = settings.WORKER_DB_CONNECTIONS or min(concurrency, 8) + 2
    return workers * min(concurrency, pool)


def measure_pgbench(url: str, *, clients: int, threads: int, seconds: float) -> dict[str, Any]:
    """The database's own commit rate for a transaction shaped like one of our transitions (an UPDATE
    of one row and two INSERTs), ``clients`` sessions at once for ``seconds``, on throwaway tables in
    the run's own database (dropped after)."""
    import psycopg

    rows = max(1000, 10 * clients)  # few enough collisions on one row that locks do not decide it
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PGBENCH_TABLES.replace("%(rows)s", str(rows)))  # type: ignore[arg-type]
    parts = urlsplit(url)
    env = {**os.environ, "PGPASSWORD": unquote(parts.password or "")}
    command = [
        pgbench_binary(), "-n", "-h", parts.hostname or "127.0.0.1", "-p", str(parts.port or 5432),
        "-U", unquote(parts.username or "postgres"), "-c", str(clients),
        "-j", str(max(1, min(threads, clients))), "-T", str(max(1, round(seconds))), "-f", "-",
        parts.path.lstrip("/"),
    ]  # fmt: skip
    script = PGBENCH_SCRIPT.format(rows=rows, pad="x" * 200)
    try:
        done = subprocess.run(command, input=script, capture_output=True, text=True, env=env, check=False)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                "DROP TABLE IF EXISTS bench_pgbench_task, bench_pgbench_event, bench_pgbench_checkpoint"
            )
    found = PGBENCH_TPS.search(done.stdout)
    if done.returncode != 0 or found is None:
        raise RuntimeError(
            f"pgbench failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return {
        "clients": clients,
        "threads": max(1, min(threads, clients)),
        "seconds": max(1, round(seconds)),
        "rows": rows,
        "tps": float(found.group(1)),
        "version": subprocess.run([command[0], "--version"], capture_output=True, text=True).stdout.strip(),
    }


@dataclass
class Backlog:
    queued: int  # runnable tasks before the workers started
    created: int  # of them started through task_create (run and verified)
    filler: int  # the rest: copies of a created task's row, behind it in the queue, never reached
    measured: int  # completions the rate is taken over
    workers: int
    concurrency: int
    latency_ms: float
    busy_s: float  # first worker commit -> the measured-th completion
    tasks_per_s: float
    worker_rss_mb: list[float] = field(default_factory=list)
    retried: int = 0


def _queue_filler(tenant: Any, like: Any, count: int) -> None:
    """``count`` more runnable tasks, each a copy of ``like``'s row under a new id (the event and
    checkpoint tables are not copied), entered after every task created so far: claims (oldest first)
    reach them only after those. They make the queue as long as the run says, at a fraction of
    ``task_create``'s cost (100,000 through it take a quarter of an hour here)."""
    from django.db import connection

    from tasks.models import Task

    q = connection.ops.quote_name
    columns = [f.column for f in Task._meta.concrete_fields]
    copied = {
        "id": "gen_random_uuid()",
        "tenant_id": "%(tenant)s",
        "created_at": "clock_timestamp()",
        "updated_at": "clock_timestamp()",
        "state_entered_at": "clock_timestamp()",
    }
    values = ", ".join(copied.get(c, f"t.{q(c)}") for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {q(Task._meta.db_table)} ({', '.join(q(c) for c in columns)}) "
            f"SELECT {values} FROM {q(Task._meta.db_table)} t, generate_series(1, %(count)s) "
            "WHERE t.id = %(like)s",
            {"tenant": tenant.pk, "count": count, "like": like.pk},
        )


def measure_backlog(args: argparse.Namespace, url: str, server: Server, logs: Path) -> Backlog:
    """``--backlog`` runnable tasks queued before the workers start; the workers run until
    ``--backlog-measure`` are completed and are stopped. Tasks/s over those completions, from the first
    worker commit: what claiming costs as the queue grows.

    Only as many tasks as the workers can reach are started through ``task_create`` (the measured
    ones and twice the slots more); the rest of the queue is filler behind them (``_queue_filler``),
    in a tenant of its own, checked untouched afterwards."""
    from django.db import connections

    from audit.models import TransitionEvent
    from tasks.models import Lease, Task
    from tenancy.models import Tenant

    slots = args.workers * args.concurrency
    created = min(args.backlog, args.backlog_measure + 2 * slots)
    tenant, create_s = _make_tasks("bench-backlog", created)
    filler_tenant = Tenant.objects.create(slug="bench-backlog-filler", name="bench-backlog-filler")
    started = time.monotonic()
    if args.backlog > created:
        like = Task.objects.filter(tenant=tenant).latest("state_entered_at")
        _queue_filler(filler_tenant, like, args.backlog - created)
    print(f"  backlog     {args.backlog:,} queued: {created:,} through task_create ({create_s:.1f} s), "
          f"{args.backlog - created:,} filler ({time.monotonic() - started:.1f} s)", flush=True)  # fmt: skip
    connections.close_all()
    settle(url, smoke=args.smoke)
    workers = Workers(args.workers, url, server.sandbox, logs, args, args.lease_ttl)
    deadline = time.monotonic() + args.max_wait
    try:
        with RssSampler(workers) as rss:
            while Task.objects.filter(tenant=tenant, state="completed").count() < args.backlog_measure:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fewer than {args.backlog_measure} tasks done after "
                                       f"{args.max_wait:g} s:\n{workers.log_tails()}")  # fmt: skip
                workers.check_alive()
                time.sleep(POLL)
            rss.sample()
    finally:
        workers.stop()
    times = list(
        TransitionEvent.objects.filter(tenant=tenant, actor_kind="worker")
        .order_by("created_at")
        .values_list("trigger", "created_at")
    )
    completions = [at for trigger, at in times if trigger == "complete"]
    busy = (completions[args.backlog_measure - 1] - times[0][1]).total_seconds()
    _, retried = _verify(tenant, stopped=True)
    touched = (
        Task.objects.filter(tenant=filler_tenant).exclude(state_version=1).count()
        + Lease.objects.filter(task__tenant=filler_tenant).count()
        + TransitionEvent.objects.filter(tenant=filler_tenant).count()
    )
    if touched:
        raise AssertionError(
            f"{touched} filler tasks, leases or events touched: the workers went past the queue"
        )
    return Backlog(
        queued=args.backlog,
        created=created,
        filler=args.backlog - created,
        measured=args.backlog_measure,
        workers=args.workers,
        concurrency=args.concurrency,
        latency_ms=args.latency_ms,
        busy_s=busy,
        tasks_per_s=args.backlog_measure / busy,
        worker_rss_mb=rss.peaks_mb,
        retried=retried,
    )


def profile_steps(args: argparse.Namespace, count: int) -> str:
    """Where a worker's time per task goes, in this process, one task at a time, no profiler overhead
    on the timings: database round trips (counted and timed at the cursor), the HTTP read of the
    evidence, the model's turn, and the rest (Python: deciding, building rows, hashing). Then the
    top functions by own CPU under cProfile."""
    import cProfile
    import io
    import pstats

    from django.db import connection

    from runtime import runner
    from tasks import leases

    tenant, _ = _make_tasks("bench-profile", count)
    spent = {"db": 0.0, "queries": 0}

    def timed(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            spent["db"] += time.perf_counter() - started
            spent["queries"] += 1

    def run_all() -> None:
        while held := leases.claim_next(worker_id="profiler", region="default", limit=1):
            runner.run_task(held[0].task_id, worker_id="profiler", region="default", held=held[0])

    started, cpu = time.perf_counter(), time.thread_time()
    with connection.execute_wrapper(timed):
        run_all()
    wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    per = 1000 / count
    out = io.StringIO()
    out.write(f"profile     {count} order_lookup tasks, one at a time in this process (3 steps each), "
              f"model {args.latency_ms:g} ms:\n")  # fmt: skip
    out.write(f"  per task  {wall * per:6.1f} ms wall = {cpu * per:5.1f} ms CPU here + waiting\n")
    out.write(f"  database  {spent['db'] * per:6.1f} ms in {spent['queries'] / count:.1f} round trips "
              "per task "
              f"({spent['queries'] / count / 3:.1f} per step)\n")  # fmt: skip
    out.write(f"  model     {args.latency_ms:6.1f} ms (the scripted turn's latency)\n")
    rest = wall * per - spent["db"] * per - args.latency_ms
    out.write(f"  the rest  {rest:6.1f} ms (HTTP read of the evidence, Python)\n")
    _make_tasks("bench-profile-cpu", count)
    if os.environ.get("BENCH_SQL"):
        from django.test.utils import CaptureQueriesContext

        _make_tasks("bench-profile-sql", 1)
        with CaptureQueriesContext(connection) as queries:
            run_all()
        out.write("\n".join(q["sql"][:150] for q in queries.captured_queries) + "\n")
    profiler = cProfile.Profile(time.thread_time)
    profiler.runcall(run_all)
    stats = pstats.Stats(profiler, stream=out)
    out.write("  this project's functions by CPU including what they call (cProfile):\n")
    stats.sort_stats("cumulative").print_stats(rf"{ROOT}/(tasks|runtime|ledger|audit|workflows)/", 20)
    return out.getvalue()


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _table(header: Sequence[str], rows: list[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        first, *rest = zip(row, widths, strict=True)
        return "  ".join([first[0].ljust(first[1]), *(cell.rjust(w) for cell, w in rest)])

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows)])


def _rss(peaks: list[float]) -> str:
    return f"{max(peaks):.0f}" if peaks else "n/a"


def render(
    throughput: Throughput | None,
    recovery: Recovery | None,
    peer: dict[str, Any] | None = None,
    *,
    pgbench: dict[str, Any] | None = None,
    backlog: Backlog | None = None,
) -> str:
    t, r = throughput, recovery
    sections = []
    if t is not None:
        sections.append(_table(
            ("throughput", "tasks", "workers x in flight", "model ms", "wall s", "busy s", "tasks/s",
             "transitions/s", "worker ms/task p50/p99", "worker RSS MB"),
            [("order_lookup", str(t.tasks), f"{t.workers} x {t.concurrency}", f"{t.latency_ms:g}",
              f"{t.wall_s:.1f}",
              f"{t.busy_s:.1f}",
              f"{t.tasks_per_s:,.1f}", f"{t.commits_per_s:,.0f}",
              f"{t.per_task_p50_ms:.0f} / {t.per_task_p99_ms:.0f}", _rss(t.worker_rss_mb))],
        ))  # fmt: skip
    if t is not None and peer is not None:
        ratio = t.tasks_per_s / peer["workflows_per_s"]
        sections.append(_table(
            ("same work", "tasks", "processes x in flight", "model ms", "busy s", "tasks/s", "steps/s"),
            [("ours", str(t.tasks), f"{t.workers} x {t.concurrency}", f"{t.latency_ms:g}", f"{t.busy_s:.1f}",
              f"{t.tasks_per_s:,.1f}", f"{t.transitions_per_s:,.0f}"),
             (f"DBOS {peer['dbos_version']}", str(peer["tasks"]),
              f"{peer['processes']} x {peer['concurrency']}",
              f"{peer['latency_ms']:g}", f"{peer['busy_s']:.1f}", f"{peer['workflows_per_s']:,.1f}",
              f"{peer['steps_per_s']:,.0f}")],
        ) + f"\n\nours / DBOS: {ratio:.2f}x")  # fmt: skip
    if t is not None and pgbench is not None:
        sections.append(_table(
            ("commits", "sessions", "seconds", "transactions/s"),
            [("ours: tasks/s x commits per task", f"{t.workers} x {t.concurrency} in flight",
              f"{t.busy_s:.1f}", f"{t.tasks_per_s:,.1f} x {t.commits_per_task:.2f} = {t.commits_per_s:,.0f}"),
             ("pgbench: UPDATE + 2 INSERTs", str(pgbench["clients"]), str(pgbench["seconds"]),
              f"{pgbench['tps']:,.0f}")],
        ) + f"\n\nours / pgbench: {pgbench['ours_over_pgbench']:.2f}")  # fmt: skip
    if backlog is not None:
        b = backlog
        sections.append(_table(
            ("backlog", "queued", "task_create + filler", "workers x in flight", "model ms", "measured",
             "busy s", "tasks/s", "worker RSS MB"),
            [("order_lookup", f"{b.queued:,}", f"{b.created:,} + {b.filler:,}",
              f"{b.workers} x {b.concurrency}", f"{b.latency_ms:g}", str(b.measured), f"{b.busy_s:.1f}",
              f"{b.tasks_per_s:,.1f}", _rss(b.worker_rss_mb))],
        ))  # fmt: skip
    first = "\n\n".join(sections)
    if r is None:
        return first
    second = _table(
        ("recovery", "tasks", "killed + survivors", "lease TTL s", "liveness", "done at kill", "stranded",
         "back in progress s", "first commit s", "all done s"),
        [("SIGKILL all victims", str(r.tasks), f"{r.workers} + {r.workers}", f"{r.lease_ttl_s:g}",
          "on" if r.liveness else "off", str(r.done_at_kill), str(r.leased_at_kill),
          f"{r.back_in_progress_s:.2f}", f"{r.first_commit_s:.2f}", f"{r.all_done_s:.1f}")],
    )  # fmt: skip
    notes = (
        "back in progress: every task a killed worker held is leased by a survivor (or done). With liveness "
        "on, a claimer sees the killed process's lock gone at once (tasks/liveness.py); off, it waits "
        "for the lease TTL."
    )
    return f"{first}\n\n{second}\n\n{notes}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=1000, help="tasks for the throughput run (default 1000)")
    parser.add_argument("--recovery-tasks", type=int, default=1000,
                        help="tasks for the recovery run (0: no recovery run)")  # fmt: skip
    parser.add_argument("--peers", action="store_true",
                        help="also run the same work on DBOS (bench/peers, its own venv)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="run_worker --concurrency: tasks in flight per worker (default 16)")  # fmt: skip
    parser.add_argument("--latency-ms", type=float, default=0,
                        help="the scripted model's answer time, MODEL_LATENCY_MS (default 0)")  # fmt: skip
    parser.add_argument("--idle", type=float, default=0.1, help="run_worker --idle seconds (default 0.1)")
    parser.add_argument("--lease-ttl", type=float, default=DEFAULT_TTL,
                        help=f"lease TTL in seconds (default {DEFAULT_TTL:g})")  # fmt: skip
    parser.add_argument("--liveness", action=argparse.BooleanOptionalAction, default=True,
                        help="workers hold a liveness lock (WORKER_LIVENESS; default on)")  # fmt: skip
    parser.add_argument("--kill-after", type=float, default=0.25,
                        help="share of the recovery tasks done before the kill (default 0.25)")  # fmt: skip
    parser.add_argument("--sweep", action=argparse.BooleanOptionalAction, default=True,
                        help="run the workers with --sweep, as deployed (default on)")  # fmt: skip
    parser.add_argument("--server", choices=("gunicorn", "runserver"), default="gunicorn")
    parser.add_argument("--server-workers", type=int, default=2, help="gunicorn processes (default 2)")
    parser.add_argument("--server-threads", type=int, default=4, help="gunicorn threads each (default 4)")
    parser.add_argument("--max-wait", type=float, default=600, help="give up a run after this many seconds")
    parser.add_argument("--pgbench-seconds", type=float, default=0,
                        help="after the throughput run, the database's own commit rate for a "
                        "transition-shaped transaction (pgbench) at the same concurrency for this long "
                        "(0: not measured)")  # fmt: skip
    parser.add_argument("--backlog", type=int, default=0, metavar="N",
                        help="instead of the throughput run: N tasks queued before the workers start, "
                        "tasks/s over the first --backlog-measure completions")  # fmt: skip
    parser.add_argument("--backlog-measure", type=int, default=500,
                        help="completions the backlog run's rate is taken over (default 500)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    add_database_arguments(parser, "bench_e2e")
    add_smoke_argument(parser)
    parser.add_argument("--no-save", action="store_true", help="do not write JSON to bench/results/")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="instead: where a worker's time per task goes (N tasks in-process)")  # fmt: skip
    args = parser.parse_args(argv)
    if (
        min(args.tasks, args.workers, args.concurrency) < 1
        or args.recovery_tasks < 0
        or not 0 <= args.kill_after < 1
        or args.backlog < 0
        or args.pgbench_seconds < 0
    ):
        parser.error("counts must be positive and --kill-after in [0, 1)")
    if args.backlog and not 1 <= args.backlog_measure <= args.backlog:
        parser.error("--backlog-measure must be between 1 and --backlog")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    server: Server | None = None
    with ExitStack() as cleanup:
        url = cleanup.enter_context(run_database(server_url, args))
        cleanup.callback(lambda: server.stop() if server is not None else None)  # before the drop
        backlog_created = min(args.backlog, args.backlog_measure + 2 * args.workers * args.concurrency)
        _make_orders(max(args.tasks, args.recovery_tasks, backlog_created), random.Random(args.seed))
        info = machine_info(url)
        print_machine(info, debug=False)
        with tempfile.TemporaryDirectory(prefix="bench-e2e-") as logs_dir:
            logs = Path(logs_dir)
            server = Server(args.server, url, logs, workers=args.server_workers, threads=args.server_threads)
            if args.profile:
                from django.conf import settings

                settings.SANDBOX_BASE_URL, settings.MODEL_LATENCY_MS = server.sandbox, args.latency_ms
                print(profile_steps(args, args.profile))
                return 0
            print(
                f"run         {args.workers} x manage.py run_worker --concurrency {args.concurrency} "
                f"--idle {args.idle:g}{' --sweep' if args.sweep else ''}, model {args.latency_ms:g} ms; "
                f"sandbox on {server.description} at {server.base}; "
                f"database {args.database}"
            )
            print()
            throughput: Throughput | None = None
            backlog: Backlog | None = None
            pgbench: dict[str, Any] | None = None
            if args.backlog:
                backlog = measure_backlog(args, url, server, logs)
                print(f"  backlog     {backlog.measured} of {backlog.queued:,} queued completed in "
                      f"{backlog.busy_s:.1f} s: {backlog.tasks_per_s:.1f} tasks/s", flush=True)  # fmt: skip
            else:
                throughput = measure_throughput(args, url, server, logs)
                print(
                    f"  throughput  {throughput.tasks} tasks created in {throughput.create_s:.1f} s, all "
                    f"completed {throughput.wall_s:.1f} s after the workers started "
                    f"({throughput.busy_s:.1f} s busy)",
                    flush=True,
                )
            if throughput is not None and args.pgbench_seconds:
                pgbench = measure_pgbench(
                    url,
                    clients=pgbench_clients(args.workers, args.concurrency),
                    threads=args.workers,
                    seconds=args.pgbench_seconds,
                )
                pgbench["ours_commits_per_s"] = throughput.commits_per_s
                pgbench["ours_over_pgbench"] = throughput.commits_per_s / pgbench["tps"]
                print(f"  pgbench     {pgbench['tps']:,.0f} transactions/s at {pgbench['clients']} clients; "
                      f"ours {throughput.commits_per_s:,.0f} commits/s", flush=True)  # fmt: skip
            peer = None
            if args.peers and throughput is not None:
                from bench.peers.harness import run_dbos

                peer = run_dbos(
                    server_url=server_url, sandbox_url=server.sandbox, tasks=args.tasks,
                    processes=args.workers, concurrency=args.concurrency, latency_ms=int(args.latency_ms),
                    database=f"{args.database}_dbos",
                )  # fmt: skip
                print(f"  peers       DBOS {peer['dbos_version']}: {peer['workflows_per_s']:.1f} workflows/s "
                      f"({peer['busy_s']:.1f} s busy)", flush=True)  # fmt: skip
            recovery = None
            if args.recovery_tasks:
                recovery = measure_recovery(args, url, server, logs)
                print(
                    f"  recovery    killed {args.workers} workers with {recovery.done_at_kill} of "
                    f"{recovery.tasks} done and {recovery.leased_at_kill} leased; all done "
                    f"{recovery.all_done_s:.1f} s later",
                    flush=True,
                )
            server.stop()
            server = None
        runs = [r for r in (throughput, recovery, backlog) if r is not None]
        verified = sum(r.created if isinstance(r, Backlog) else r.tasks for r in runs)
        retried = sum(r.retried for r in runs)
        unfinished = " (those the stopped workers left: runnable, each step so far once)" if backlog else ""
        print(f"\nverified    {verified} tasks: completed with the record's status{unfinished}, audit chains "
              f"intact, no step committed twice ({retried} retried a failed read)\n")  # fmt: skip
        table = render(throughput, recovery, peer, pgbench=pgbench, backlog=backlog)
        print(table)
        if not args.no_save:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"e2e-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
            path.write_text(json.dumps({
                "machine": info,
                "args": vars(args),
                "throughput": asdict(throughput) if throughput else None,
                "recovery": asdict(recovery) if recovery else None,
                "peer": peer,
                "pgbench": pgbench,
                "backlog": asdict(backlog) if backlog else None,
                "table": table,
            }, indent=2))  # fmt: skip
            print(f"\nresults     {path.relative_to(ROOT)}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
