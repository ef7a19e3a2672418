"""The queue row: one read for the console's queue and ``GET /api/tasks/``, one query a page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from reads.queue import queue_rows
from tasks.models import Lease, Task
from tasks.states import State
from tests.conftest import api_client_for

pytestmark = pytest.mark.django_db


def _tasks(tenant, count: int) -> list[Task]:
    """``count`` ready tasks, every other one held by a live worker's lease."""
    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(
            tenant=tenant,
            task_type="refund_request",
            objective=f"Queued {n}",
            input={},
            state=State.READY,
            policy_version="p1",
            created_at=now,
            updated_at=now,
            state_entered_at=now,
        )
        for n in range(count)
    )
    Lease.objects.bulk_create(
        Lease(
            task=task,
            worker_id=f"w{n}",
            token=n + 1,
            acquired_at=now,
            heartbeat_at=now,
            expires_at=now + timedelta(minutes=5),
        )
        for n, task in enumerate(tasks)
        if n % 2
    )
    return tasks


def test_a_page_of_queue_rows_is_one_query_with_tenant_and_lease(acme, django_assert_num_queries):
    tasks = _tasks(acme, 200)
    leased = {task.id: bool(n % 2) for n, task in enumerate(tasks)}
    with django_assert_num_queries(1):
        rows = list(queue_rows(Task.objects.filter(tenant=acme)).order_by("-id")[:200])
        shown = {row.id: (row.tenant.slug, row.leased) for row in rows}
    assert shown == {task_id: ("acme", live) for task_id, live in leased.items()}


def _count(client, path: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(path)
    assert response.status_code == 200
    return len(captured)


def test_the_queue_and_the_task_list_cost_the_same_for_few_rows_and_a_full_page(acme, operator):
    api, console = api_client_for(operator), Client()
    console.force_login(operator)
    _tasks(acme, 2)
    few = _count(api, "/api/tasks/"), _count(console, "/console/")
    _tasks(acme, 120)
    many = _count(api, "/api/tasks/"), _count(console, "/console/")
    assert many[0] <= few[0] + 1 and many[1] <= few[1] + 1, (few, many)  # + a "next page" probe at most
    page = console.get("/console/").content.decode()
    shown = Task.objects.order_by("-id")[:50]  # the queue's first page, newest first
    held = Lease.objects.filter(task__in=shown).count()
    assert (page.count(">active</small>"), page.count(">eligible</small>")) == (held, 50 - held)


def test_the_summary_s_estimates_are_one_explain_for_every_label_each_the_planner_s_own(acme, globex):
    """Past the cap the bar says "about N" from the statistics: every label's estimate comes from one
    ``EXPLAIN`` (not one per label), and each is what the planner estimates for that label alone."""
    from reads import queue

    now = timezone.now()
    states = [State.READY, State.RESUME_VALIDATION, State.QUARANTINED, State.COMPLETED, State.FAILED]
    Task.objects.bulk_create(
        Task(tenant=(acme, globex)[n % 2], task_type="refund_request", objective=f"Q {n}", input={},
             state=states[n % 7 % len(states)], policy_version="p1", created_at=now, updated_at=now,
             state_entered_at=now)
        for n in range(3000)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")
        # Serial plans here (the pages earlier tests left behind could make a parallel one look cheap);
        # a parallel plan is the second case below.
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 0")
    labels = [State.READY, State.RESUME_VALIDATION, State.QUARANTINED, queue.FINISHED]
    tenants = [acme.pk, globex.pk]
    with CaptureQueriesContext(connection) as queries:
        found = queue.estimated_counts(tenants, labels)
    assert len(queries.captured_queries) == 2  # the table's statistics, then one EXPLAIN
    with connection.cursor() as cursor:
        for label in labels:
            wanted = sorted(queue.TERMINAL) if label == queue.FINISHED else [label]
            sql, params = Task.objects.filter(tenant_id__in=tenants, state__in=wanted).query.sql_with_params()
            assert found[label] == queue._plan(cursor, sql, params)["Plan Rows"], label
    assert found[State.QUARANTINED] < found[queue.FINISHED] and all(n > 0 for n in found.values())
    with connection.cursor() as cursor:  # a plan that runs the arms in parallel workers
        cursor.execute("SET LOCAL max_parallel_workers_per_gather = 2")
        for setting in ("parallel_setup_cost", "parallel_tuple_cost", "min_parallel_table_scan_size",
                        "min_parallel_index_scan_size"):  # fmt: skip
            cursor.execute(f"SET LOCAL {setting} = 0")
        cursor.execute("SET LOCAL enable_indexscan = off")
        cursor.execute("SET LOCAL enable_indexonlyscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        with CaptureQueriesContext(connection) as queries:
            assert queue.estimated_counts(tenants, labels) == found  # each label's estimate, asked alone
    assert len(queries.captured_queries) == 2 + len(labels)
