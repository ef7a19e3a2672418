"""The operator console at scale: the queue, a task page, the inbox, the audit at 10k and 100k tasks.

What it measures
    Wall time (median of ``--repeat`` requests, after ``--warmup``) and the SQL
    queries of each console read, made through Django's test client by a logged-in
    operator (queue, task page), approver (inbox, request page) and auditor
    (audit search, export):

    queue            GET /console/                      unfiltered, newest first
    queue ?<filter>  each filter: state, task_type, region, escalated, stuck, reason, age
    queue ?q=        search ("order B-1": a term that fills a page at any size)
    queue ?sort=age  longest in state first
    task             GET /console/tasks/<id>/           a task with ``--history`` (1,000) events
    inbox            GET /console/approvals/            with ``--approvals`` (10,000) pending
    request          GET /console/approvals/<id>/
    audit            GET /console/audit/                unfiltered and ``?reason=``
    export           GET /console/audit/export.csv      the first ``--export-rows`` rows of the stream
    dashboard        GET /console/dashboard/            as served: its database reading shared and kept
                                                        METRICS_CACHE_SECONDS (15 s), so most views reuse it
    dashboard cold   (printed apart, outside the goals) the same page with that reading made anew each time:
                                                        what one view in every 15 s pays

    first with ``--small`` (10,000) bulk tasks, then, in the same database, with
    ``--large`` (100,000; ``--large 1000000`` for a million), each beside the
    approvals' tasks (so every filter has full pages at both sizes; the table's
    ``rows`` column shows the rows each page rendered at each size). It
    prints each median, the large/small ratio and whether the goals hold: every
    page at most 1.5x from small to large, and a median of at most 150 ms at the
    large size.

    The bulk tasks (spread over states, types, ages, some escalated, each with its
    start event and a checkpoint) are written by SQL (``INSERT ... SELECT
    generate_series``), not the ORM; the script prints how long seeding took.
    The measured task page and request page are built through the real service
    path (``advance``; ``request_decision``), so they verify and decode.

How to run
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/console.py
    .venv/bin/python bench/console.py --small 10000 --large 1000000 --repeat 9

    DATABASE_URL names the *server*; the script creates its own database
    (``--database``, default ``bench_console``), migrates it and drops it at the
    end (``--keep-database`` leaves it for ``EXPLAIN``). DEBUG is off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/console.py` puts bench/ first, not the project

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    recreate_database,
    settle,
    setup_client_benchmark,
    signed_in_client,
    throwaway_name,
    with_dbname,
)

RATIO_GOAL = 1.5
MEDIAN_GOAL_MS = 150.0
STATES = [
    "ready", "waiting_input", "waiting_approval", "waiting_external", "waiting_retry", "outcome_unknown",
    "quarantined", "completed", "completed", "completed", "failed", "canceled", "expired",
]  # fmt: skip
TYPES = ["refund_request", "order_lookup", "pay_invoice"]

# One statement per table; %(first)s..%(last)s are the bulk tasks' numbers. Task ids are derived
# from the number (md5), so events and checkpoints find their task without a join.
TASKS_SQL = """
INSERT INTO tasks_task (id, task_type, region, state, state_version, state_reason, outcome, objective,
    input, idempotency_key, request_digest, deadline, wait_deadline, attempt, policy_version, model_id,
    prompt_id, toolset_id, escalation_level, escalated_to, escalation_reason, audit_head, created_at,
    updated_at, state_entered_at, owner_id, tenant_id, rerun_of_id, parent_id)
SELECT md5('bench' || n)::uuid, (%(types)s::text[])[1 + n %% 3], 'default',
    (%(states)s::text[])[1 + n %% %(nstates)s], 1,
    CASE WHEN n %% 7 = 0 THEN 'step_error' ELSE '' END, NULL,
    'Refund order B-' || n, jsonb_build_object('order_id', 'B-' || n, 'amount', '10.00'), NULL, '',
    NULL, CASE WHEN (%(states)s::text[])[1 + n %% %(nstates)s] LIKE 'waiting_%%'
        THEN now() + ((n %% 97) - 5) * interval '1 hour' END, 0, '2026-11', 'scripted', 'p@1', 't@1',
    CASE WHEN n %% 50 = 0 THEN 1 ELSE 0 END, CASE WHEN n %% 50 = 0 THEN 'operator' ELSE '' END, '', '',
    now() - ((n * 7919) %% 100003) * interval '7 seconds', now(),
    now() - ((n * 7919) %% 100003) * interval '7 seconds', %(owner)s, %(tenant)s,
    NULL, NULL
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""
EVENTS_SQL = """
INSERT INTO audit_transitionevent (state_version, from_state, to_state, trigger, actor_kind, actor_id,
    reason, reason_code, attempt, policy_version, parent_id, trace_id, created_at, prev_hash, hash,
    task_id, tenant_id, checkpoint_digest, key_id)
SELECT 1, '', 'ready', 'start', 'system', 'bench', 'started',
    CASE WHEN n %% 7 = 0 THEN 'step_error' ELSE '' END, 0, '2026-11', NULL, '',
    now() - ((n * 7919) %% 100003) * interval '7 seconds', '', md5('e' || n) || md5('f' || n),
    md5('bench' || n)::uuid, %(tenant)s, '', ''
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""
CHECKPOINTS_SQL = """
INSERT INTO tasks_checkpoint (state_version, schema_version, codec, body, created_at, task_id, digest)
SELECT 1, 2, 'json/v1', '{"schema_version":2,"step":""}', now(), md5('bench' || n)::uuid, ''
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""


def bulk_tasks(url: str, *, tenant: int, owner: int, first: int, last: int) -> float:
    """Tasks ``first``..``last`` with a start event and a checkpoint each; returns seconds taken."""
    if last < first:
        return 0.0
    started = time.perf_counter()
    params = {
        "first": first, "last": last, "tenant": tenant, "owner": owner, "types": TYPES, "states": STATES,
        "nstates": len(STATES),
    }  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (TASKS_SQL, EVENTS_SQL, CHECKPOINTS_SQL):
            conn.execute(statement, params)
    return time.perf_counter() - started


def long_task(tenant: Any, owner: Any, events: int) -> Any:
    """A task with ``events`` events, every one written by ``advance`` (STEP self-loops)."""
    from tasks import checkpoints
    from tasks.services import task_create
    from tasks.states import State, Trigger
    from tasks.transitions import Actor, advance

    task, _ = task_create(
        tenant=tenant,
        task_type="order_lookup",
        objective="Look up order L-1 (long history)",
        input={"order_id": "L-1"},
        actor=Actor.system("bench"),
        owner=owner,
    )
    worker = Actor.worker("bench")
    for turn in range(1, events - 1):
        progress = checkpoints.Progress(step="lookup", facts={"order_id": "L-1", "turn": turn})
        task = advance(task.id, task.state_version, State.READY, actor=worker, trigger=Trigger.STEP,
                       progress=progress, reason=f"turn {turn}")  # fmt: skip
    progress = checkpoints.Progress(step="summarize", facts={"order_id": "L-1"})
    return advance(task.id, task.state_version, State.WAITING_RETRY, actor=worker,
                   trigger=Trigger.ATTEMPT_FAILED, progress=progress, attempt=1,
                   wait_deadline=task.created_at.replace(year=task.created_at.year + 1))  # fmt: skip


def first_rows(response: Any, rows: int) -> Any:
    """Read a streamed export until ``rows`` lines arrived (what a user's first screenful costs)."""
    seen = 0
    for chunk in response.streaming_content:
        seen += bytes(chunk).count(b"\n")
        if seen >= rows:
            break
    response.close()
    return response


def _rows(response: Any) -> int | None:
    """Table rows on a page (``<tr``), so the two sizes can be seen to render the same amount."""
    return None if response.streaming else response.content.count(b"<tr")


def _measure(call: Callable[[], Any], *, warmup: int, repeat: int) -> tuple[float, int, int | None]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = call()
        times.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.status_code
    with CaptureQueriesContext(connection) as queries:
        call()
    return statistics.median(times), len(queries), _rows(response)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=10_000, help="bulk tasks in the first measurement")
    parser.add_argument("--large", type=int, default=100_000, help="bulk tasks in the second")
    parser.add_argument("--approvals", type=int, default=10_000, help="pending approval requests")
    parser.add_argument("--history", type=int, default=1_000, help="events of the measured task page")
    parser.add_argument("--export-rows", type=int, default=500, help="rows read from the audit export")
    parser.add_argument("--repeat", type=int, default=7, help="timed requests per read (median)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--database", default=throwaway_name("bench_console"))
    parser.add_argument("--keep-database", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    try:
        setup_client_benchmark(url)
        from django.contrib.auth import get_user_model
        from django.core.cache import cache

        from bench.approvals import _bulk_requests, _real_request
        from tenancy.models import Role, Tenant
        from tenancy.services import grant_role, role_group

        tenant = Tenant.objects.create(slug="bench", name="Benchmark")
        users = get_user_model().objects
        clients = {}
        for role in (Role.OPERATOR, Role.APPROVER, Role.AUDITOR):
            user = users.create_user(username=f"bench-{role}", password="x")
            grant_role(user, tenant, role)
            clients[role] = signed_in_client(user)
        operator = users.get(username=f"bench-{Role.OPERATOR}")
        op, appr, aud = clients[Role.OPERATOR], clients[Role.APPROVER], clients[Role.AUDITOR]

        started = time.perf_counter()
        long = long_task(tenant, operator, args.history)
        real = _real_request(tenant, operator)
        _bulk_requests(tenant, role_group(tenant, Role.APPROVER), args.approvals - 1, offset=1)
        print(f"setup       task with {args.history:,} events and {args.approvals:,} pending approvals "
              f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
        base = long.__class__.objects.count()  # the approvals' tasks and the long one, beside the bulk ones

        reads: dict[str, Callable[[], Any]] = {
            "queue": lambda: op.get("/console/"),
            "queue state": lambda: op.get("/console/", {"state": "waiting_input"}),
            "queue type": lambda: op.get("/console/", {"task_type": "order_lookup"}),
            "queue region": lambda: op.get("/console/", {"region": "default"}),
            "queue escalated": lambda: op.get("/console/", {"escalated": "true"}),
            "queue stuck": lambda: op.get("/console/", {"stuck": "true"}),
            "queue reason": lambda: op.get("/console/", {"reason": "step_error"}),
            "queue age": lambda: op.get("/console/", {"age": "1d"}),
            "queue q": lambda: op.get("/console/", {"q": "order B-1"}),  # matches a full page at any size
            "queue sort age": lambda: op.get("/console/", {"sort": "age"}),
            "task page": lambda: op.get(f"/console/tasks/{long.id}/"),
            "inbox": lambda: appr.get("/console/approvals/"),
            "request": lambda: appr.get(f"/console/approvals/{real.pk}/"),
            "audit": lambda: aud.get("/console/audit/"),
            "audit reason": lambda: aud.get("/console/audit/", {"reason": "step_error"}),
            "audit export": lambda: first_rows(aud.get("/console/audit/export.csv"), args.export_rows),
            "dashboard": lambda: op.get("/console/dashboard/"),
        }
        # The dashboard's shared reading made anew on every request (the cache emptied first).
        cold = {"dashboard cold": lambda: (cache.clear(), op.get("/console/dashboard/"))[1]}
        load = os.getloadavg()
        print(f"load        {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.repeat} timed requests per read")
        results: dict[int, dict[str, tuple[float, int, int | None]]] = {}
        seeded = 0
        for size in (args.small, args.large):
            # Bulk tasks in every state are seeded *beside* the approvals' tasks, so each filter has
            # full pages at both sizes: comparing an empty page with a full one would measure nothing.
            took = bulk_tasks(url, tenant=tenant.pk, owner=operator.pk, first=seeded + 1, last=size)
            added = max(size - seeded, 0)
            print(f"seeded      {added:,} tasks (+ event, checkpoint each) by SQL in {took:.1f} s "
                  f"({added / max(took, 1e-9):,.0f} tasks/s); {size + base:,} in the tenant")  # fmt: skip
            seeded = max(size, seeded)
            settle(url)
            results[size] = {
                name: _measure(call, warmup=args.warmup, repeat=args.repeat)
                for name, call in {**reads, **cold}.items()
            }
        worst, slowest = 0.0, 0.0
        print(f"\n| page | {args.small:,} tasks | {args.large:,} tasks | ratio | queries | rows |")
        print("|---|---|---|---|---|---|")
        for name in reads:
            (small, _, rows_small), (large, queries, rows_large) = (
                results[args.small][name],
                results[args.large][name],
            )
            ratio = large / small
            worst, slowest = max(worst, ratio), max(slowest, large)
            rows = "stream" if rows_large is None else f"{rows_small} / {rows_large}"
            print(f"| {name} | {small:.1f} ms | {large:.1f} ms | {ratio:.2f}x | {queries} | {rows} |")
        for name in cold:
            (small, _, _), (large, queries, _) = results[args.small][name], results[args.large][name]
            print(f"\n{name} (outside the goals): {small:.1f} ms at {args.small:,}, {large:.1f} ms at "
                  f"{args.large:,}, {queries} queries")  # fmt: skip
        verdict = "met" if worst <= RATIO_GOAL else "NOT met"
        print(f"\nworst ratio {worst:.2f}x (goal <= {RATIO_GOAL}x): {verdict}")
        print(f"slowest median at {args.large:,}: {slowest:.1f} ms (goal <= {MEDIAN_GOAL_MS:.0f} ms): "
              f"{'met' if slowest <= MEDIAN_GOAL_MS else 'NOT met'}")  # fmt: skip
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_database:
            recreate_database(server_url, args.database, create=False)


if __name__ == "__main__":
    sys.exit(main())
