"""Transition throughput: ``tasks.transitions.advance()`` against the same SQL issued raw.

What it measures
    Committed transitions per second at 1 and 8 concurrent writers (``--writers``),
    two ways:

    advance  each writer calls ``advance(task, version, READY, trigger="step",
             actor=Actor.worker(...), progress=Progress(...))`` through Django;
    raw      each writer issues, with plain psycopg and no Django, the statements
             advance() issues on PostgreSQL, in autocommit: SELECT the task row;
             then one statement, WITH moved AS (UPDATE tasks_task ... WHERE id AND
             state AND state_version RETURNING id) inserting the audit event (HMAC
             chain hash computed in Python by ``audit.chain.keyed_hash``) and the
             checkpoint (the same canonical JSON body) FROM moved, its count checked.
             (Before issue 27 both sent BEGIN, the SELECT, the UPDATE, two INSERTs
             and COMMIT.)

    ``advance / raw`` is the share of the raw rate our code keeps: the overhead of
    the ORM, pydantic, tracing and the primitive's checks on top of the database's
    own cost. The raw path binds parameters client-side (``psycopg.ClientCursor``),
    as Django's PostgreSQL backend does by default, so both send identical
    statements over the same protocol.

    Every writer advances its own tasks (``--tasks-per-writer``, round robin, with
    ``expected_version`` tracked locally), so no two writers touch the same row.
    Writers are processes (``spawn``: threads would share one GIL on a 2-core
    machine) or, with ``--mode threads``, threads. Each writer
    warms up (``--warmup`` s), waits for the others at a barrier, then runs for
    ``--seconds``. Each measurement gets fresh tasks after VACUUM + CHECKPOINT.

    Before measuring, the script captures the SQL of one real advance() and
    warns if it no longer matches the statements the raw path mirrors. After
    measuring, it verifies every task the benchmark wrote: hash chain intact
    (``audit.chain.verify_task``), newest checkpoint decodes, version as expected,
    so the raw path is shown to write exactly what advance() writes.

How to run
    make bench                               # DATABASE_URL defaults to the local server
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/transitions.py --seconds 10 --repeat 3
    .venv/bin/python bench/transitions.py --profile 2000   # + cProfile of one writer

    DATABASE_URL names the *server* (any database on it the user may connect to);
    the script creates its own database (``--database``, default ``bench_durable_<pid>_<hex>``),
    copied from the migrated template, and drops it at the end. It runs with DEBUG off (``--debug`` to
    keep Django's per-query logging on, as the default settings do). Results are
    also written as JSON to ``bench/results/`` (git-ignored) unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing
import os
import pstats
import queue
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/transitions.py` puts bench/ first, not the project

from audit import canonical  # noqa: E402  (pure Python: no Django)
from audit.chain import GENESIS, keyed_hash  # noqa: E402  (pure Python: no Django)
from audit.keys import parse_chain_keys  # noqa: E402  (parses the environment's value; no settings)
from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    RESULTS_DIR,
    add_database_arguments,
    add_smoke_argument,
    drop_unless_kept,
    machine_info,
    migrate_database,
    print_machine,
    recreate_database,
    settle,
    setup_django,
    with_dbname,
)

Impl = Literal["advance", "raw"]
Mode = Literal["processes", "threads"]
Step = Callable[[int], None]  # performs transition number n of one writer

# ---------------------------------------------------------------------------
# The raw path: the statements advance() issues (see _check_mirror), by hand.
# ---------------------------------------------------------------------------

# tasks_task columns in model order, as the ORM selects them.
TASK_COLUMNS = (
    "id", "tenant_id", "task_type", "owner_id", "region", "api_token_id", "ownership_epoch",
    "checkpoint_schema", "parent_id", "rerun_of_id", "compensates_id", "state",
    "state_version", "state_reason", "outcome", "objective", "input", "idempotency_key", "request_digest",
    "deadline", "wait_deadline", "attempt", "policy_version", "model_id", "prompt_id", "toolset_id",
    "escalation_level", "escalated_to", "escalation_reason", "audit_head", "takeover_head", "created_at",
    "updated_at", "state_entered_at",
)  # fmt: skip
# Besides state, version, reason, timestamps and head, advance() rewrites every CHANGEABLE field.
CHANGEABLE_COLUMNS = (
    "outcome", "toolset_id", "policy_version", "escalated_to", "model_id", "prompt_id",
    "escalation_level", "escalation_reason", "attempt", "wait_deadline",
)  # fmt: skip
EVENT_COLUMNS = (
    "task_id", "tenant_id", "state_version", "from_state", "to_state", "trigger", "actor_kind", "actor_id",
    "reason", "reason_code", "attempt", "policy_version", "parent_id", "trace_id", "checkpoint_digest",
    "created_at", "prev_hash", "hash", "key_id",
)  # fmt: skip
CHECKPOINT_COLUMNS = ("task_id", "state_version", "schema_version", "codec", "body", "digest", "created_at")

SELECT_TASK = f"SELECT {', '.join(TASK_COLUMNS)} FROM tasks_task WHERE id = %s ORDER BY id ASC LIMIT 1"
UPDATE_TASK = (
    "UPDATE tasks_task SET state = %s, state_version = (state_version + 1), state_reason = %s, "
    "updated_at = %s, state_entered_at = %s, audit_head = %s, checkpoint_schema = %s, "
    + ", ".join(f"{name} = %s" for name in CHANGEABLE_COLUMNS)
    + " WHERE (id = %s AND state = %s AND state_version = %s AND ownership_epoch = %s)"
)
# The commit as advance() sends it on PostgreSQL (issue 27): one statement, outside a transaction,
# whose history rows are inserted only if the compare-and-set moved the row.
COMMIT_STEP = (
    f"WITH moved AS ({UPDATE_TASK} RETURNING id), "
    f"event AS (INSERT INTO audit_transitionevent ({', '.join(EVENT_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(EVENT_COLUMNS))} FROM moved), "
    f"checkpoint AS (INSERT INTO tasks_checkpoint ({', '.join(CHECKPOINT_COLUMNS)}) "
    f"SELECT {', '.join(['%s'] * len(CHECKPOINT_COLUMNS))} FROM moved) "
    "SELECT count(*) FROM moved"
)
# (verb, table) of each statement, compared with what advance() really sends.
RAW_SHAPE = ["SELECT tasks_task", "WITH"]


def _iso(value: datetime | None) -> str | None:
    """A datetime as pydantic's JSON mode writes it (UTC, ``Z``)."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _facts(writer: int, n: int) -> dict[str, Any]:
    return {"n": n, "writer": writer, "note": "bench"}


def raw_transition(
    conn: psycopg.Connection[Any],
    task_id: UUID,
    expected_version: int,
    *,
    actor_id: str,
    step: str,
    facts: dict[str, Any],
) -> None:
    """READY -> READY by trigger ``step``, statement for statement as advance() does it (``conn`` in
    autocommit: the read, then the commit's one statement)."""
    with conn.cursor() as cur:
        cur.execute(SELECT_TASK, (task_id,))
        row = cur.fetchone()
        if row is None:
            raise LookupError(f"task {task_id} does not exist")
        task = dict(zip(TASK_COLUMNS, row, strict=True))
        if task["state_version"] != expected_version or task["state"] != "ready":
            raise RuntimeError(f"task {task_id} is at {task['state']} v{task['state_version']}")
        now = datetime.now(UTC)
        version = expected_version + 1
        # The checkpoint first: the event records its digest (as advance() does).
        body = {
            "approvals": [], "attempt": task["attempt"], "created_at": _iso(task["created_at"]),
            "deadline": _iso(task["deadline"]), "evidence": [], "facts": facts, "input_refs": [],
            "output_refs": [], "pending_actions": [], "policy_version": task["policy_version"],
            "runtime_config": {"model": task["model_id"], "prompt": task["prompt_id"],
                               "tool_set": task["toolset_id"]},
            "schema_version": 1, "state": "ready", "state_entered_at": _iso(task["state_entered_at"]),
            "state_version": version, "step": step, "task_id": str(task_id), "tool_calls": [],
            "trace_link": "", "wait_deadline": _iso(task["wait_deadline"]),
        }  # fmt: skip
        encoded = canonical.dumps(body, version=canonical.V1_ASCII)  # as checkpoints.encode
        digest = canonical.digest_text(encoded)
        fields: dict[str, Any] = {
            "task_id": task_id, "tenant_id": task["tenant_id"], "state_version": version,
            "from_state": "ready", "to_state": "ready", "trigger": "step", "actor_kind": "worker",
            "actor_id": actor_id, "reason": "", "reason_code": "", "attempt": task["attempt"],
            "policy_version": task["policy_version"], "parent_id": task["parent_id"], "trace_id": "",
            "checkpoint_digest": digest, "created_at": now,
        }  # fmt: skip
        prev_hash = task["audit_head"] or GENESIS
        key = parse_chain_keys(os.environ["AUDIT_HMAC_KEYS"])[0]  # set by setup_django, as advance() uses
        head = keyed_hash(prev_hash, fields, key.secret)
        # A self-loop keeps state_entered_at and wait_deadline; CHANGEABLE fields are written back as read.
        outcome = Jsonb(task["outcome"]) if task["outcome"] is not None else None
        changeable = [outcome, *(task[name] for name in CHANGEABLE_COLUMNS[1:])]
        where = [task_id, "ready", expected_version, task["ownership_epoch"]]
        written = ["ready", "", now, task["state_entered_at"], head, 1]  # 1: the body's schema
        event = [*fields.values(), prev_hash, head, key.id]
        checkpoint = [task_id, version, 1, "json/v1", encoded, digest, now]
        cur.execute(COMMIT_STEP, [*written, *changeable, *where, *event, *checkpoint])
        (moved,) = cur.fetchone() or (0,)
        if moved != 1:
            raise RuntimeError(f"task {task_id} moved on from v{expected_version}")


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------


def _advance_step(writer: int, task_ids: list[str], versions: list[int], debug: bool) -> Step:
    setup_django(debug)
    from tasks import checkpoints
    from tasks.states import State, Trigger
    from tasks.transitions import Actor, advance

    actor = Actor.worker(f"bench-{writer}")

    def step(n: int) -> None:
        slot = n % len(task_ids)
        progress = checkpoints.Progress(step=f"step-{n}", facts=_facts(writer, n))
        advance(
            task_ids[slot], versions[slot], State.READY, actor=actor, trigger=Trigger.STEP, progress=progress
        )
        versions[slot] += 1

    return step


def _raw_step(
    writer: int, task_ids: list[str], versions: list[int], url: str
) -> tuple[Step, Callable[[], None]]:
    conn = psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor)
    ids = [UUID(task_id) for task_id in task_ids]
    actor_id = f"worker:bench-{writer}"

    def step(n: int) -> None:
        slot = n % len(ids)
        raw_transition(
            conn, ids[slot], versions[slot], actor_id=actor_id, step=f"step-{n}", facts=_facts(writer, n)
        )
        versions[slot] += 1

    return step, conn.close


@dataclass
class WriterResult:
    writer: int
    transitions: int
    elapsed: float
    latencies: list[float]
    versions: list[int]


@dataclass
class WriterJob:
    impl: Impl
    writer: int
    task_ids: list[str]
    versions: list[int]
    url: str
    warmup: float
    seconds: float
    debug: bool


def _nothing() -> None:
    pass


def _writer(job: WriterJob, barrier: Any, results: Any) -> None:
    """Warm up, meet the other writers at ``barrier``, run for ``job.seconds``, report."""
    close: Callable[[], None] = _nothing
    try:
        if job.impl == "advance":
            step = _advance_step(job.writer, job.task_ids, job.versions, job.debug)
            from django.db import connections

            close = connections.close_all
        else:
            step, close = _raw_step(job.writer, job.task_ids, job.versions, job.url)
        n = 0
        warm_until = time.perf_counter() + job.warmup
        while n < len(job.task_ids) or time.perf_counter() < warm_until:
            step(n)
            n += 1
        barrier.wait(timeout=120)
        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + job.seconds
        while (before := time.perf_counter()) < deadline:
            step(n)
            latencies.append(time.perf_counter() - before)
            n += 1
        elapsed = time.perf_counter() - start
        results.put(WriterResult(job.writer, len(latencies), elapsed, latencies, list(job.versions)))
    except BaseException:
        barrier.abort()
        results.put(f"writer {job.writer} ({job.impl}) failed:\n{traceback.format_exc()}")
    finally:
        close()


@dataclass
class Phase:
    impl: Impl
    mode: Mode
    writers: int
    repeat: int
    transitions: int
    seconds: float
    per_second: float
    p50_ms: float
    p99_ms: float
    # task id -> final version, for the verification pass (not saved)
    final_versions: dict[str, int] = field(default_factory=dict, repr=False)


def run_phase(
    impl: Impl,
    mode: Mode,
    task_sets: list[list[str]],
    *,
    url: str,
    warmup: float,
    seconds: float,
    debug: bool,
    repeat: int,
) -> Phase:
    """Run ``len(task_sets)`` writers of ``impl`` at once and collect their counts."""
    writers = len(task_sets)
    jobs = [
        WriterJob(impl, i, ids, [1] * len(ids), url, warmup, seconds, debug)
        for i, ids in enumerate(task_sets)
    ]
    workers: list[multiprocessing.process.BaseProcess | threading.Thread]
    if mode == "processes":
        ctx = multiprocessing.get_context("spawn")
        barrier: Any = ctx.Barrier(writers)
        results: Any = ctx.Queue()
        workers = [ctx.Process(target=_writer, args=(job, barrier, results), daemon=True) for job in jobs]
    else:
        barrier, results = threading.Barrier(writers), queue.Queue()
        workers = [
            threading.Thread(target=_writer, args=(job, barrier, results), daemon=True) for job in jobs
        ]
    for worker in workers:
        worker.start()
    collected: list[WriterResult] = []
    errors: list[str] = []
    try:
        for _ in jobs:
            item = results.get(timeout=warmup + seconds + 180)
            if isinstance(item, str):
                errors.append(item)
            else:
                collected.append(item)
    except BaseException:  # Ctrl-C or SIGTERM: stop the writer processes now, not after their run
        for worker in workers:
            if isinstance(worker, multiprocessing.process.BaseProcess):
                worker.terminate()
        raise
    finally:
        for worker in workers:
            worker.join(timeout=30)
    if errors:
        raise RuntimeError("\n".join(errors))
    latencies = sorted(x for r in collected for x in r.latencies)
    cuts = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [latencies[0]] * 99
    final_versions = {
        task_id: version
        for r in collected
        for task_id, version in zip(jobs[r.writer].task_ids, r.versions, strict=True)
    }
    return Phase(
        impl=impl,
        mode=mode,
        writers=writers,
        repeat=repeat,
        transitions=sum(r.transitions for r in collected),
        seconds=max(r.elapsed for r in collected),
        # Each writer's own rate, summed: start skew between writers does not count as idle time.
        per_second=sum(r.transitions / r.elapsed for r in collected),
        p50_ms=cuts[49] * 1000,
        p99_ms=cuts[98] * 1000,
        final_versions=final_versions,
    )


# ---------------------------------------------------------------------------
# Database, Django and checks (main process)
# ---------------------------------------------------------------------------


def _make_tasks(tenant: Any, count: int) -> list[str]:
    """Start ``count`` tasks at ``ready`` v1 through the primitive (no API, no worker doorbell)."""
    from tasks import checkpoints
    from tasks.models import Task
    from tasks.transitions import Actor, task_start

    ids = []
    for i in range(count):
        task = Task(
            tenant=tenant,
            task_type="refund_request",
            objective=f"Refund order B-{i}",
            input={"order_id": f"B-{i}", "customer_email": "c@example.com", "amount": "10.00"},
            region="default",
            policy_version="2026-11",
            model_id="scripted-v1",
            prompt_id="refund-triage@1",
            toolset_id="payments+tickets@1",
        )
        progress = checkpoints.Progress(step="start", facts=_facts(0, i))
        ids.append(str(task_start(task, actor=Actor.system("bench"), progress=progress).id))
    return ids


def _shape(statement: str) -> str:
    words = statement.replace('"', "").split()
    verb = words[0].upper()
    if verb == "SELECT":
        return f"SELECT {words[words.index('FROM') + 1]}"
    if verb == "UPDATE":
        return f"UPDATE {words[1]}"
    if verb == "INSERT":
        return f"INSERT {words[2]}"
    return verb


def _check_mirror(tenant: Any) -> list[str]:
    """Capture one real advance() and report where the raw path no longer mirrors it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks import checkpoints
    from tasks.models import Task
    from tasks.transitions import Actor, advance

    problems = []
    model_columns = tuple(f.column for f in Task._meta.concrete_fields)
    if model_columns != TASK_COLUMNS:
        problems.append(f"tasks_task columns changed: {model_columns}")
    (task_id,) = _make_tasks(tenant, 1)
    with CaptureQueriesContext(connection) as captured:
        advance(
            task_id,
            1,
            "ready",
            actor=Actor.worker("mirror"),
            trigger="step",
            progress=checkpoints.Progress(step="mirror", facts=_facts(0, 0)),
        )
    shape = [_shape(q["sql"]) for q in captured.captured_queries]
    if shape != RAW_SHAPE:
        problems.append(f"advance() now issues {shape}, the raw path mirrors {RAW_SHAPE}")
    return problems


def _verify(phases: list[Phase]) -> tuple[int, int]:
    """Every benchmarked task: chain intact, newest checkpoint decodes, at the version its writer reached."""
    from audit.models import TransitionEvent
    from audit.verify import verify_task
    from tasks import services
    from tasks.models import Task

    expected = {task_id: version for phase in phases for task_id, version in phase.final_versions.items()}
    tasks = Task.objects.filter(pk__in=list(expected))
    checked = 0
    for task in tasks:
        broken = verify_task(task)
        if broken is not None:
            raise AssertionError(f"audit chain broken: {broken}")
        if task.state_version != expected[str(task.id)]:
            raise AssertionError(
                f"task {task.id} at v{task.state_version}, writer ended at {expected[str(task.id)]}"
            )
        document = services.latest_checkpoint(task)  # digest checked against the audit event, too
        if document.state_version != task.state_version:
            raise AssertionError(f"task {task.id}: newest checkpoint is for v{document.state_version}")
        checked += 1
    if checked != len(expected):
        raise AssertionError(f"verified {checked} tasks, expected {len(expected)}")
    return checked, TransitionEvent.objects.filter(task_id__in=list(expected)).count()


# What the usual callees of advance() stand for, in the profile's listing.
PROFILE_NOTES = {
    "first": "SELECT task",
    "update": "CAS UPDATE",
    "_write_history": "INSERTs",
    "_write_records": "INSERTs",
    "manager_method": "filter()",
    "_event_for": "event+hash",
    "_checkpoint_for": "pydantic",
}


def _package(filename: str) -> str:
    """The top-level package a profiled function belongs to (``~``: C functions)."""
    if filename == "~":
        return "builtins and C functions"
    path = Path(filename)
    if "site-packages" in path.parts:
        return path.parts[path.parts.index("site-packages") + 1].removesuffix(".py")
    if path.is_relative_to(ROOT):
        return path.relative_to(ROOT).parts[0].removesuffix(".py")
    return "stdlib"


def _per_call(step: Step, count: int) -> tuple[float, float]:
    """(wall, client CPU) seconds per call of ``step``, after a short warm-up."""
    for n in range(50):
        step(n)
    wall, cpu = time.perf_counter(), time.process_time()
    for n in range(50, 50 + count):
        step(n)
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def _profile(tenant: Any, url: str, count: int, debug: bool, top: int = 12) -> str:
    """Where one writer's time goes: client CPU vs waiting, then a CPU profile of advance()."""
    out = io.StringIO()
    out.write(f"profile     one in-process writer, {count} transitions each, no profiler:\n")
    steps: dict[str, Step] = {"advance": _advance_step(0, _make_tasks(tenant, 1), [1], debug)}
    steps["raw"], close = _raw_step(0, _make_tasks(tenant, 1), [1], url)
    cpu: dict[str, float] = {}
    for impl, step in steps.items():
        wall, cpu[impl] = _per_call(step, count)
        out.write(f"  {impl:<8} wall {wall * 1e6:6.0f} µs = client CPU {cpu[impl] * 1e6:6.0f} µs "
                  f"+ waiting for PostgreSQL {(wall - cpu[impl]) * 1e6:6.0f} µs\n")  # fmt: skip
    close()
    extra = (cpu["advance"] - cpu["raw"]) * 1e6
    out.write(f"  advance() costs {extra:.0f} µs more client CPU per transition than the raw path\n\n")

    # CPU time, not wall time: waiting on the socket is the database's share. cProfile inflates
    # call-heavy code (the ORM) most, so shares are indicative; "µs" scales a share to the
    # unprofiled CPU per advance() measured above.
    profiler = cProfile.Profile(time.thread_time)
    profiler.runcall(_per_call, _advance_step(0, _make_tasks(tenant, 1), [1], debug), count)
    stats = pstats.Stats(profiler, stream=out)
    table: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    key = next(k for k in table if k[2] == "advance" and k[0].endswith(str(Path("tasks", "transitions.py"))))
    total, per_call = table[key][3], cpu["advance"] * 1e6

    def row(label: str, share: float) -> None:
        out.write(f"    {label:<60} {share:6.1%} {share * per_call:6.0f} µs\n")

    out.write("cProfile of advance() by CPU time\n  what advance() calls:\n")
    callees = [(callee, entry[4][key][3]) for callee, entry in table.items() if key in entry[4]]
    for (filename, line, name), spent in sorted(callees, key=lambda item: -item[1])[:top]:
        where = f"{Path(filename).name}:{line}({name})" if filename != "~" else name
        row(f"{where} {PROFILE_NOTES.get(name, '')}", spent / total)
    by_package: dict[str, float] = {}
    for (filename, _, _), (_, _, own, _, _) in table.items():
        by_package[_package(filename)] = by_package.get(_package(filename), 0.0) + own
    everything = sum(by_package.values())
    out.write("  own CPU by package:\n")
    for package, own in sorted(by_package.items(), key=lambda item: -item[1])[:8]:
        row(package, own / everything)
    out.write(f"  top {top} functions by own CPU:\n")
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    return out.getvalue()


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _median_of(phases: list[Phase], impl: Impl, mode: str, writers: int, attr: str) -> float:
    values = [getattr(p, attr) for p in phases if (p.impl, p.mode, p.writers) == (impl, mode, writers)]
    return statistics.median(values) if values else float("nan")


def render_table(phases: list[Phase]) -> str:
    """One row per (mode, writers): medians over the repeats."""
    header = ("mode", "writers", "advance() tx/s", "raw tx/s", "advance/raw", "advance p50/p99 ms",
              "raw p50/p99 ms")  # fmt: skip
    rows = [header]
    for mode, writers in sorted({(p.mode, p.writers) for p in phases}):
        adv, raw = (_median_of(phases, impl, mode, writers, "per_second") for impl in ("advance", "raw"))
        latency = {
            impl: f"{_median_of(phases, impl, mode, writers, 'p50_ms'):.2f} / "
            f"{_median_of(phases, impl, mode, writers, 'p99_ms'):.2f}"
            for impl in ("advance", "raw")
        }
        rows.append((mode, str(writers), f"{adv:,.0f}", f"{raw:,.0f}", f"{adv / raw:.2f}", latency["advance"],
                     latency["raw"]))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        first, *rest = zip(row, widths, strict=True)
        return "  ".join([first[0].ljust(first[1]), *(cell.rjust(w) for cell, w in rest)])

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *(line(row) for row in rows[1:])])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured duration per run (default 5)")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="warm-up per writer before measuring (default 1)"
    )
    parser.add_argument("--writers", default="1,8", help="comma-separated writer counts (default 1,8)")
    parser.add_argument("--tasks-per-writer", type=int, default=8, help="tasks each writer cycles through")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement; the table shows medians")
    parser.add_argument("--mode", choices=("processes", "threads"), default="processes")
    add_database_arguments(parser, "bench_durable")
    add_smoke_argument(parser)
    parser.add_argument("--debug", action="store_true", help="run Django with DEBUG on (records every query)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also cProfile N advance() calls by one in-process writer")  # fmt: skip
    parser.add_argument("--no-save", action="store_true", help="do not write JSON to bench/results/")
    args = parser.parse_args(argv)
    args.writer_counts = [int(w) for w in args.writers.split(",") if w.strip()]
    if not args.writer_counts or min(args.writer_counts) < 1 or args.tasks_per_writer < 1 or args.repeat < 1:
        parser.error("writers, --tasks-per-writer and --repeat must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    try:
        os.environ["DATABASE_URL"] = url  # for Django, here and in the spawned writers
        setup_django(args.debug)
        from django.db import connections

        from tenancy.models import Tenant

        migrate_database(server_url, args.database, fresh=args.fresh_migrate)
        tenant = Tenant.objects.create(slug="bench", name="Benchmark")
        info = machine_info(url)
        print_machine(info, debug=args.debug)
        print(
            f"run         {args.mode}, {args.seconds:g} s measured after {args.warmup:g} s warm-up, "
            f"{args.tasks_per_writer} tasks per writer, {args.repeat} run(s) per cell, "
            f"database {args.database}"
        )
        for problem in _check_mirror(tenant):
            print(f"WARNING     raw path out of date: {problem}")
        print()

        phases: list[Phase] = []
        for repeat in range(args.repeat):
            for writers in args.writer_counts:
                impls: tuple[Impl, Impl] = ("advance", "raw") if repeat % 2 == 0 else ("raw", "advance")
                for impl in impls:
                    ids = _make_tasks(tenant, writers * args.tasks_per_writer)
                    task_sets = [ids[i::writers] for i in range(writers)]
                    connections.close_all()
                    settle(url, smoke=args.smoke)
                    phase = run_phase(impl, args.mode, task_sets, url=url, warmup=args.warmup,
                                      seconds=args.seconds, debug=args.debug, repeat=repeat)  # fmt: skip
                    phases.append(phase)
                    print(
                        f"  run {repeat + 1}  {impl:<7}  {writers} writer(s)  {phase.transitions:>7} "
                        f"transitions in {phase.seconds:.2f} s  {phase.per_second:>8,.0f}/s  "
                        f"p50 {phase.p50_ms:.2f} ms  p99 {phase.p99_ms:.2f} ms",
                        flush=True,
                    )

        tasks_checked, events = _verify(phases)
        print(
            f"\nverified    {tasks_checked} tasks, {events} events: hash chains intact, newest checkpoints "
            "decode, versions match the writers\n"
        )
        table = render_table(phases)
        print(table)
        most = max(args.writer_counts)
        ratio = _median_of(phases, "advance", args.mode, most, "per_second") / _median_of(
            phases, "raw", args.mode, most, "per_second"
        )
        verdict = "meets" if ratio >= 0.5 else "BELOW"
        print(f"\nadvance/raw at {most} writers = {ratio:.2f} ({verdict} the 0.5 goal)")

        if args.profile:
            print()
            print(_profile(tenant, url, args.profile, args.debug))

        if not args.no_save:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"transitions-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
            path.write_text(json.dumps({
                "machine": info,
                "args": {k: v for k, v in vars(args).items() if k != "writer_counts"},
                "phases": [{k: v for k, v in asdict(p).items() if k != "final_versions"} for p in phases],
                "table": table,
                "ratio_at_max_writers": ratio,
            }, indent=2))  # fmt: skip
            print(f"results     {path.relative_to(ROOT)}")
        return 0
    finally:
        if "django.db" in sys.modules:
            sys.modules["django.db"].connections.close_all()
        drop_unless_kept(server_url, args.database, args.keep_database)


if __name__ == "__main__":
    sys.exit(main())
