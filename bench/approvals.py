"""Approvals at scale: the inbox, a request page and the API inbox at 10 and at 10,000 pending requests.

What it measures
    Wall time (median of ``--repeat`` requests, after ``--warmup``) and the
    number of SQL queries of three reads made by one approver through Django's
    test client (the whole view: middleware, session, templates, serializers):

    inbox    GET /console/approvals/
    page     GET /console/approvals/<id>/     (a request built the way a worker builds it)
    api      GET /api/approvals/?status=pending

    first with ``--small`` (10) pending requests the approver may decide, then,
    in the same database, with ``--large`` (10,000). It prints each median and
    the large/small ratio; the goal is a ratio of at most 1.2 for each read,
    i.e. none of them grows with the number of pending requests. Lists are read
    in pages of ``--page`` (10) rows at both sizes (the console's page size is
    set for the run, the API gets ``page_size``), so both render the same rows.
    ``--no-analyze`` measures before PostgreSQL has statistics for the new rows,
    the state in which the old generic-permission query went quadratic.

    The bulk requests are inserted directly (tasks at ``waiting_approval`` with
    the matching version, one request each) and the object permission is
    granted the way ``approvals.services.request_decision`` grants it:
    ``guardian.shortcuts.assign_perm`` to the tenant's approver group. The
    measured request page is built through the real service path
    (``request_decision`` + ``decisions.commit``), so it has a checkpoint.

How to run
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/approvals.py
    .venv/bin/python bench/approvals.py --small 10 --large 10000 --repeat 15

    DATABASE_URL names the *server*; the script creates its own database
    (``--database``, default ``bench_approvals_<pid>_<hex>``), copied from the migrated template,
    and drops it at the end (``--keep-database`` leaves it for ``EXPLAIN``). DEBUG is off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `python bench/approvals.py` puts bench/ first, not the project

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    add_database_arguments,
    drop_unless_kept,
    recreate_database,
    setup_client_benchmark,
    signed_in_client,
    with_dbname,
)

GOAL = 1.2


def _analyze(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _real_request(tenant: Any, owner: Any) -> Any:
    """One refund waiting for approval, built through the service path (it has a checkpoint)."""
    from django.utils import timezone

    from approvals import services
    from approvals.models import ApprovalRequest
    from tasks import checkpoints, decisions, registry
    from tasks.models import Task
    from tasks.services import task_create
    from tasks.states import State, Trigger
    from tasks.transitions import Actor, advance

    task, _ = task_create(
        tenant=tenant,
        task_type="refund_request",
        objective="Refund order A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": "10.00", "currency": "USD"},
        actor=Actor.system("bench"),
        owner=owner,
    )
    kind = registry.get(task.task_type)
    now = timezone.now()
    facts = {**kind.initial_facts(task.input), "order_status": "delivered", "order_total": "100.00"}
    progress = checkpoints.Progress(
        step="approve",
        facts=facts,
        evidence=[
            checkpoints.EvidenceRef(system="orders", record_id="A-1", record_version="1", fetched_at=now)
        ],
    )
    worker = Actor.worker("bench")
    task = advance(task.id, 1, State.READY, actor=worker, trigger=Trigger.STEP, progress=progress)
    ask = services.request_decision(task, kind, kind.step("approve"), progress, now=now)
    task = decisions.commit(task, ask, actor=worker)
    assert Task.objects.get(pk=task.pk).state == State.WAITING_APPROVAL
    return ApprovalRequest.objects.get(task=task)


def _bulk_requests(tenant: Any, group: Any, count: int, offset: int) -> None:
    """``count`` more pending requests the approver group may decide, inserted in bulk."""
    from django.utils import timezone
    from guardian.shortcuts import assign_perm

    from approvals.digest import digest
    from approvals.models import ApprovalRequest
    from approvals.services import DECIDE
    from tasks.models import Task
    from tasks.states import State

    now = timezone.now()
    for start in range(0, count, 2000):
        size = min(2000, count - start)
        tasks = [
            Task(
                tenant=tenant,
                task_type="refund_request",
                objective=f"Refund order B-{offset + start + i}",
                input={"order_id": f"B-{offset + start + i}", "amount": "10.00"},
                state=State.WAITING_APPROVAL,
                state_version=5,
                policy_version="2026-11",
                wait_deadline=now + timedelta(days=1),
                created_at=now,
                updated_at=now,
                state_entered_at=now,
            )
            for i in range(size)
        ]
        Task.objects.bulk_create(tasks)
        fields = {"step": "refund", "connector": "payments", "effect": {"kind": "refund", "amount": "10.00"}}
        requests = [
            ApprovalRequest(
                task=task,
                tenant=tenant,
                step="approve",
                action_step="refund",
                waiting_version=5,
                consequential=fields,
                digest=digest(fields),
                policy_reason="Refunds need a person.",
                policy_version="2026-11",
                requested_by=f"task:{task.id}",
                allowed_decisions=["approve", "reject"],
                expires_at=now + timedelta(hours=1 + (start + i) % 20),
                created_at=now - timedelta(seconds=offset + start + i),
            )
            for i, task in enumerate(tasks)
        ]
        ApprovalRequest.objects.bulk_create(requests)
        assign_perm(DECIDE, group, ApprovalRequest.objects.filter(pk__in=[r.pk for r in requests]))


def _measure(call: Callable[[], Any], *, warmup: int, repeat: int) -> tuple[float, int]:
    """Median milliseconds of ``call`` and the queries one call makes."""
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
    return statistics.median(times), len(queries)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", type=int, default=10, help="pending requests in the first measurement")
    parser.add_argument("--large", type=int, default=10_000, help="pending requests in the second")
    parser.add_argument("--repeat", type=int, default=15, help="timed requests per read (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--page", type=int, default=10, help="rows per inbox and API page (at most --small: equal pages)"
    )
    parser.add_argument(
        "--no-analyze", action="store_true", help="measure right after seeding, before statistics exist"
    )
    add_database_arguments(parser, "bench_approvals")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    try:
        setup_client_benchmark(url, server_url, args.database, fresh_migrate=args.fresh_migrate)
        from django.contrib.auth import get_user_model

        from tenancy.models import Role, Tenant
        from tenancy.services import grant_role, role_group

        tenant = Tenant.objects.create(slug="bench", name="Benchmark")
        users = get_user_model().objects
        operator = users.create_user(username="bench-operator", password="x")
        approver = users.create_user(username="bench-approver", password="x")
        grant_role(operator, tenant, Role.OPERATOR)
        grant_role(approver, tenant, Role.APPROVER)
        group = role_group(tenant, Role.APPROVER)
        client = signed_in_client(approver)

        from console import views

        # Both sizes render pages of the same length, so the ratio shows what the backlog
        # costs, not what rendering 50 rows instead of 10 costs.
        views.PAGE = args.page
        real = _real_request(tenant, operator)
        reads: dict[str, Callable[[], Any]] = {
            "inbox": lambda: client.get("/console/approvals/"),
            "page": lambda: client.get(f"/console/approvals/{real.pk}/"),
            "api": lambda: client.get("/api/approvals/", {"status": "pending", "page_size": args.page}),
        }
        load = os.getloadavg()
        print(
            f"load        {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.repeat} timed requests per read, "
            f"pages of {args.page} rows"
        )
        results: dict[int, dict[str, tuple[float, int]]] = {}
        seeded = 1
        for size in (args.small, args.large):
            _bulk_requests(tenant, group, size - seeded, offset=seeded)
            seeded = size
            if not args.no_analyze:
                _analyze(url)
            results[size] = {
                name: _measure(call, warmup=args.warmup, repeat=args.repeat) for name, call in reads.items()
            }
            line = "  ".join(f"{name} {ms:7.1f} ms ({n} q)" for name, (ms, n) in results[size].items())
            print(f"{size:>7,} pending  {line}")
        worst = 0.0
        for name in reads:
            ratio = results[args.large][name][0] / results[args.small][name][0]
            worst = max(worst, ratio)
            print(f"ratio {args.large:,}/{args.small:,}  {name:<5} {ratio:5.2f}x")
        print(f"worst ratio {worst:.2f}x (goal <= {GOAL}x): {'met' if worst <= GOAL else 'NOT met'}")
        return 0
    finally:
        from django.db import connections

        connections.close_all()
        drop_unless_kept(server_url, args.database, args.keep_database)


if __name__ == "__main__":
    sys.exit(main())
