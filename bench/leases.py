"""Lease claims under contention: ``tasks.leases.claim_next`` against the same claim issued raw.

What it measures
    Claims per second when several claimers (processes) compete for one pool of runnable tasks,
    at 1, 4 and 8 claimers (``--claimers``), two ways:

    ours  each claimer calls ``claim_next(worker_id=…, region=…, limit=--batch)`` through Django
          (candidates locked ``FOR UPDATE SKIP LOCKED``, oldest first, skipping tasks with a live
          lease; lease rows locked and moved to the next token; takeovers recorded), then gives
          every lease back with ``release``;
    raw   each claimer issues, with plain psycopg, the smallest SQL that claims the same way: one
          statement that locks the oldest unleased runnable candidates with ``SKIP LOCKED`` and
          moves their lease rows on one token, then one UPDATE per lease that gives it back.

    Every claimer competes for the same oldest tasks, so the pool (``--tasks``) is hot: this is
    the worst case for the claim, many workers of one region polling at once. ``ours / raw`` is
    the share of the raw claim rate the runtime keeps.

What it checks
    Every claim takes the lease to its next token under the task's row lock, so after a run the
    claims counted for each task by all claimers together equal the tokens its lease row moved
    by, and no two claims of one task share a token. Either failing would be a double claim: the
    run stops with an error.

How to run
    make bench-leases
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/leases.py \\
        --seconds 5 --claimers 1,4,8 --repeat 3

    DATABASE_URL names the server; the script creates its own database (``--database``), copied
    from the migrated template, and drops it at the end. Results are written as JSON to
    ``bench/results/`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    RESULTS_DIR,
    add_database_arguments,
    add_smoke_argument,
    machine_info,
    print_machine,
    run_database,
    settle,
    setup_django,
)

Impl = Literal["ours", "raw"]
REGION = "bench"
TTL_SECONDS = 30.0

# The raw claim: the oldest runnable tasks of the region without a live lease, locked and skipped
# when another claimer holds them, their lease rows moved to the next token in the same statement.
RAW_CLAIM = """
WITH candidates AS (
    SELECT t.id FROM tasks_task t
    WHERE t.state = ANY(%(states)s) AND t.region = %(region)s
      AND NOT EXISTS (SELECT 1 FROM tasks_lease l WHERE l.task_id = t.id AND l.expires_at > now())
    ORDER BY t.state_entered_at
    LIMIT %(limit)s
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE tasks_lease l
SET token = l.token + 1, worker_id = %(worker)s, acquired_at = now(), heartbeat_at = now(),
    expires_at = now() + make_interval(secs => %(ttl)s)
FROM candidates c
WHERE l.task_id = c.id
RETURNING l.task_id, l.token
"""
RAW_RELEASE = (
    "UPDATE tasks_lease SET expires_at = now(), heartbeat_at = now() WHERE task_id = %s AND token = %s"
)


@dataclass
class Job:
    impl: Impl
    claimer: int
    url: str
    batch: int
    warmup: float
    seconds: float


@dataclass
class ClaimerResult:
    claimer: int
    claims: int  # counted during the measured window
    empty: int  # claim calls that found nothing free (every candidate locked or leased)
    elapsed: float
    tokens: list[tuple[str, int]]  # every (task id, token) this claimer took, warm-up included


def _ours(job: Job) -> tuple[Callable[[], list[tuple[str, int]]], Callable[[], None]]:
    setup_django(debug=False)
    from datetime import timedelta

    from django.db import connections

    from tasks import leases

    ttl = timedelta(seconds=TTL_SECONDS)
    worker = f"bench-{job.claimer}"

    def claim() -> list[tuple[str, int]]:
        held = leases.claim_next(worker_id=worker, region=REGION, limit=job.batch, ttl=ttl)
        for lease in held:
            leases.release(lease)
        return [(str(lease.task_id), lease.token) for lease in held]

    return claim, connections.close_all


def _raw(job: Job) -> tuple[Callable[[], list[tuple[str, int]]], Callable[[], None]]:
    from tasks.states import RUNNABLE  # plain constants: no Django set-up needed

    conn = psycopg.connect(job.url, autocommit=True, cursor_factory=psycopg.ClientCursor)
    params = {"states": list(RUNNABLE), "region": REGION, "limit": job.batch,
              "worker": f"raw-{job.claimer}", "ttl": TTL_SECONDS}  # fmt: skip

    def claim() -> list[tuple[str, int]]:
        with conn.transaction():
            held = conn.execute(RAW_CLAIM, params).fetchall()
        for task_id, token in held:
            conn.execute(RAW_RELEASE, (task_id, token))
        return [(str(task_id), token) for task_id, token in held]

    return claim, conn.close


def _claimer(job: Job, barrier: Any, results: Any) -> None:
    """Warm up, meet the others at ``barrier``, claim and release for ``job.seconds``, report."""
    close: Callable[[], None] = lambda: None  # noqa: E731
    try:
        os.environ["DATABASE_URL"] = job.url
        claim, close = (_ours if job.impl == "ours" else _raw)(job)
        tokens: list[tuple[str, int]] = []
        warm_until = time.perf_counter() + job.warmup
        while time.perf_counter() < warm_until:
            tokens += claim()
        barrier.wait(timeout=120)
        claims = empty = 0
        start = time.perf_counter()
        while time.perf_counter() < start + job.seconds:
            got = claim()
            tokens += got
            claims += len(got)
            empty += not got
        results.put(ClaimerResult(job.claimer, claims, empty, time.perf_counter() - start, tokens))
    except BaseException:
        barrier.abort()
        results.put(f"claimer {job.claimer} ({job.impl}) failed:\n{traceback.format_exc()}")
    finally:
        close()


@dataclass
class Phase:
    impl: Impl
    claimers: int
    repeat: int
    claims: int
    per_second: float
    empty_share: float


def run_phase(impl: Impl, claimers: int, *, url: str, args: argparse.Namespace, repeat: int) -> Phase:
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(claimers), ctx.Queue()
    jobs = [Job(impl, i, url, args.batch, args.warmup, args.seconds) for i in range(claimers)]
    procs = [ctx.Process(target=_claimer, args=(job, barrier, results), daemon=True) for job in jobs]
    for proc in procs:
        proc.start()
    collected: list[ClaimerResult] = []
    errors: list[str] = []
    try:
        for _ in jobs:
            item = results.get(timeout=args.warmup + args.seconds + 180)
            (errors.append if isinstance(item, str) else collected.append)(item)  # type: ignore[operator]
    except BaseException:  # Ctrl-C or SIGTERM: stop the claimers now, not after their run
        for proc in procs:
            proc.terminate()
        raise
    finally:
        for proc in procs:
            proc.join(timeout=30)
    if errors:
        raise RuntimeError("\n".join(errors))
    _check_tokens(url, [r.tokens for r in collected])
    calls = sum(r.claims for r in collected) + sum(r.empty for r in collected)
    return Phase(
        impl=impl,
        claimers=claimers,
        repeat=repeat,
        claims=sum(r.claims for r in collected),
        per_second=sum(r.claims / r.elapsed for r in collected),
        empty_share=sum(r.empty for r in collected) / calls if calls else 0.0,
    )


def _check_tokens(url: str, taken: list[list[tuple[str, int]]]) -> None:
    """No double claim: tokens unique per task, and each task's claims equal its lease's token moves."""
    seen = Counter(pair for claimer in taken for pair in claimer)
    shared = [pair for pair, n in seen.items() if n > 1]
    if shared:
        raise AssertionError(f"double claims: {len(shared)} (task, token) pairs taken twice: {shared[0]}…")
    per_task = Counter(task_id for task_id, _ in seen)
    with psycopg.connect(url) as conn:
        tokens = dict(conn.execute("SELECT task_id::text, token FROM tasks_lease").fetchall())
    # Each run starts from leases at token 1 (see _reset), so a task's claims move it by exactly that.
    moved = {task_id: token - 1 for task_id, token in tokens.items() if token > 1}
    if moved != dict(per_task):
        wrong = {t for t in set(moved) | set(per_task) if moved.get(t, 0) != per_task.get(t, 0)}
        raise AssertionError(f"{len(wrong)} tasks' lease tokens disagree with the claims counted")


def _seed(count: int) -> None:
    """``count`` runnable tasks of the bench region, each with a released lease at token 1."""
    from django.utils import timezone

    from tasks.checkpoints import Progress
    from tasks.models import Lease, Task
    from tasks.transitions import Actor, task_start
    from tenancy.models import Tenant

    tenant = Tenant.objects.create(slug="bench", name="Benchmark")
    now = timezone.now()
    for i in range(count):
        task = Task(tenant=tenant, task_type="order_lookup", objective=f"Look up order B-{i}",
                    input={"order_id": f"B-{i}"}, region=REGION, policy_version="2026-11")  # fmt: skip
        task_start(task, actor=Actor.system("bench"), progress=Progress(step="start"))
        Lease.objects.create(task=task, worker_id="seed", token=1, acquired_at=now, heartbeat_at=now,
                             expires_at=now)  # fmt: skip


def _reset(url: str, smoke: bool) -> None:
    """Leases back to token 1 and released, so every phase starts alike and tokens count its claims."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE tasks_lease SET token = 1, expires_at = now(), heartbeat_at = now()")
    settle(url, smoke=smoke)


def render_table(phases: list[Phase], counts: list[int]) -> str:
    def median(impl: Impl, n: int, key: str) -> float:
        return statistics.median(getattr(p, key) for p in phases if p.impl == impl and p.claimers == n)

    lines = ["| claimers | ours claims/s | raw claims/s | ours / raw | ours empty polls | raw empty polls |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for n in counts:
        ours, raw = median("ours", n, "per_second"), median("raw", n, "per_second")
        empty = f"{median('ours', n, 'empty_share'):.0%} | {median('raw', n, 'empty_share'):.0%}"
        lines.append(f"| {n} | {ours:,.0f} | {raw:,.0f} | {ours / raw:.2f} | {empty} |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=3.0, help="measured duration per phase")
    parser.add_argument("--warmup", type=float, default=0.5, help="warm-up per claimer before measuring")
    parser.add_argument("--claimers", default="1,4,8", help="comma-separated claimer process counts")
    parser.add_argument("--tasks", type=int, default=200, help="runnable tasks all claimers compete for")
    parser.add_argument("--batch", type=int, default=4, help="tasks asked for per claim call")
    parser.add_argument("--repeat", type=int, default=1, help="runs per cell; the table shows medians")
    add_database_arguments(parser, "bench_leases")
    add_smoke_argument(parser)
    parser.add_argument("--no-save", action="store_true", help="do not write JSON to bench/results/")
    args = parser.parse_args(argv)
    args.claimer_counts = [int(n) for n in args.claimers.split(",") if n.strip()]
    if min([*args.claimer_counts, args.tasks, args.batch, args.repeat], default=0) < 1:
        parser.error("claimers, --tasks, --batch and --repeat must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    with run_database(server_url, args) as url:
        from django.db import connections

        _seed(args.tasks)
        connections.close_all()
        info = machine_info(url)
        print_machine(info, debug=False)
        print(f"run         {args.tasks} runnable tasks, claims of up to {args.batch}, {args.seconds:g} s "
              f"measured after {args.warmup:g} s warm-up, {args.repeat} run(s) per cell\n")  # fmt: skip
        phases: list[Phase] = []
        for repeat in range(args.repeat):
            for claimers in args.claimer_counts:
                impls: tuple[Impl, Impl] = ("ours", "raw") if repeat % 2 == 0 else ("raw", "ours")
                for impl in impls:
                    _reset(url, args.smoke)
                    phase = run_phase(impl, claimers, url=url, args=args, repeat=repeat)
                    phases.append(phase)
                    print(f"  run {repeat + 1}  {impl:<4}  {claimers} claimer(s)  {phase.claims:>7} claims  "
                          f"{phase.per_second:>8,.0f}/s  empty polls {phase.empty_share:.0%}",
                          flush=True)  # fmt: skip
        print("\nchecked     no double claims: tokens unique per task, lease tokens moved once per claim\n")
        table = render_table(phases, args.claimer_counts)
        print(table)
        if not args.no_save:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"leases-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
            most = max(args.claimer_counts)
            ours, raw = ([p.per_second for p in phases if p.impl == impl and p.claimers == most]
                         for impl in ("ours", "raw"))  # fmt: skip
            ratio = statistics.median(ours) / statistics.median(raw)
            path.write_text(json.dumps({
                "machine": info,
                "args": {k: v for k, v in vars(args).items() if k != "claimer_counts"},
                "phases": [vars(p) for p in phases],
                "table": table,
                "ratio_at_max_claimers": ratio,
            }, indent=2))  # fmt: skip
            print(f"results     {path.relative_to(ROOT)}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
