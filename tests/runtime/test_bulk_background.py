"""Bulk operations past the in-request limit: an exact count, a background run in batches with progress,
and a runner killed mid-way (a real SIGKILL, and a crash between a control and its result) that ends
with every task acted on exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit.models import TransitionEvent
from console.bulk import exact_count
from runtime import bulk
from runtime.models import BulkOperation, BulkResult, BulkSnapshot, BulkStatus, Outcome
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.workflow import ROOT, database_url, wait_for


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _confirm(client: Client, objective: str, reason: str = "Backlog") -> BulkOperation:
    response = client.post(
        "/console/bulk/new/",
        {"control": "escalate", "target": "all", "q": objective, "reason": reason, "escalate_to": "admin"},
    )
    assert response.status_code == 302, response.content.decode()[:500]
    return BulkOperation.objects.get(pk=response["Location"].rstrip("/").rsplit("/", 1)[1])


def _bulk_events(operation: BulkOperation) -> dict[str, int]:
    """How many transitions this operation made on each task (from the audit, not from the results)."""
    found: dict[str, int] = {}
    for task_id in TransitionEvent.objects.filter(
        reason=f"{operation.reason} (bulk {operation.id})"
    ).values_list("task_id", flat=True):
        found[str(task_id)] = found.get(str(task_id), 0) + 1
    return found


@pytest.mark.django_db
def test_the_preview_counts_exactly_past_the_old_ten_thousand_ceiling_and_refuses_past_the_setting(
    operator, acme, settings
):
    settings.BULK_MAX_TASKS, settings.BULK_SYNC_LIMIT = 30, 5
    for n in range(31):
        make_task(acme, objective=f"Exact count {n}")
    client = _client(operator)
    page = client.get("/console/bulk/new/", {"control": "escalate", "target": "all", "q": "Exact count"})
    text = page.content.decode()
    assert page.status_code == 200 and '<span id="bulk-count">31 tasks</span>' in text
    assert "31 tasks match, more than the 30 one operation may act on" in text
    assert "Confirm:" not in text  # nothing to confirm past the ceiling
    settings.BULK_MAX_TASKS = 31
    text = client.get(
        "/console/bulk/new/", {"control": "escalate", "target": "all", "q": "Exact count"}
    ).content
    assert b"Confirm: escalate 31 tasks" in text and b"runs in the background" in text


@pytest.mark.django_db
def test_a_count_past_its_budget_is_canceled_by_postgresql_not_capped(acme):
    for n in range(3):
        make_task(acme, objective=f"Slow {n}")
    slow = Task.objects.filter(tenant=acme).extra(where=["pg_sleep(0.2) IS NOT NULL"])  # noqa: S610
    assert exact_count(slow, budget_ms=50) is None  # statement_timeout canceled it
    assert exact_count(Task.objects.filter(tenant=acme), budget_ms=50) == 3
    with connection.cursor() as cursor:  # and the request's own timeout is back as it was
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


@pytest.mark.django_db
def test_a_preview_that_cannot_count_in_time_says_counting_and_the_follow_up_fills_it_in(
    operator, acme, settings
):
    """A real timeout: 20,000 tasks cannot be counted in 1 ms; the follow-up's budget can."""
    make_task(acme, objective="Counted later 0")
    columns = [f.column for f in Task._meta.concrete_fields]
    copied = [
        "gen_random_uuid()" if c == "id" else "NULL" if c == "idempotency_key" else f'"{c}"' for c in columns
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO tasks_task ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in columns)}) "  # noqa: S608
            f"SELECT {', '.join(copied)} FROM tasks_task, generate_series(1, 20000) WHERE tenant_id = %s",
            [acme.id],
        )
        cursor.execute("ANALYZE tasks_task")
    settings.BULK_COUNT_BUDGET_MS = 1
    client = _client(operator)
    query = {"control": "escalate", "target": "all", "q": "Counted later"}
    first = client.get("/console/bulk/new/", query).content.decode()
    assert "counting…" in first and 'hx-trigger="load"' in first and "10,000+" not in first
    assert "Confirm: escalate every matching task" in first
    follow_up = first.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert "count=full" in follow_up
    filled = client.get(follow_up).content.decode()
    assert '<span id="bulk-count">20,001 tasks</span>' in filled


@pytest.mark.django_db
def test_the_worker_writes_the_results_the_confirmation_snapshotted_and_progress_moves_by_batch(
    operator, acme, settings, monkeypatch
):
    settings.BULK_SYNC_LIMIT = 5
    monkeypatch.setattr(bulk, "CHUNK", 4)
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)
    tasks = [make_task(acme, objective=f"Batch {n}") for n in range(10)]
    client = _client(operator)
    with CaptureQueriesContext(connection) as confirming:
        operation = _confirm(client, "Batch")
    # The request writes the one snapshot row, no per-task result: that is the worker's to write.
    assert not [
        q
        for q in confirming
        if 'INTO "runtime_bulkresult"' in q["sql"] or "INTO runtime_bulkresult" in q["sql"]
    ]
    assert (operation.status, operation.total, BulkResult.objects.filter(operation=operation).count()) == (
        BulkStatus.QUEUED,
        10,
        0,
    )
    page = client.get(f"/console/bulk/{operation.id}/").content.decode()
    assert "0 of 10" in page and "the worker writes each task" in page
    assert bulk.run_pending("w1", budget=4) == 4
    assert BulkResult.objects.filter(operation=operation).count() == 10
    assert not BulkSnapshot.objects.filter(operation=operation).exists()
    page = client.get(f"/console/bulk/{operation.id}/").content.decode()
    assert "4 of 10" in page and 'http-equiv="refresh"' in page
    bulk.bulk_run(operation.id, runner="w1")
    operation.refresh_from_db()
    assert (operation.status, operation.done, operation.applied) == (BulkStatus.DONE, 10, 10)
    assert _bulk_events(operation) == {str(task.id): 1 for task in tasks}
    assert 'http-equiv="refresh"' not in client.get(f"/console/bulk/{operation.id}/").content.decode()


@pytest.mark.django_db
def test_a_task_that_moves_before_the_worker_writes_the_results_is_stale_at_its_confirmed_version(
    operator, acme, settings, monkeypatch
):
    """The results come from what the operator confirmed, not from the tasks when the worker starts:
    a task moved in between keeps its confirmed version and is left alone."""
    settings.BULK_SYNC_LIMIT = 2
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)
    moved, *kept = [make_task(acme, objective=f"Moved later {n}") for n in range(4)]
    operation = _confirm(_client(operator), "Moved later")
    advance(moved.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="checkpoint_corrupt")
    operation = bulk.bulk_run(operation.id, runner="w1")
    assert (operation.status, operation.applied, operation.stale) == (BulkStatus.DONE, 3, 1)
    result = BulkResult.objects.get(operation=operation, task_id=moved.id)
    assert (result.expected_version, result.outcome, result.version_after) == (1, Outcome.STALE, 2)
    assert Task.objects.get(pk=moved.id).state == State.QUARANTINED  # not overwritten


@pytest.mark.django_db(transaction=True)
def test_two_runners_writing_out_the_same_snapshot_at_once_write_each_result_once(
    operator, acme, settings, monkeypatch
):
    """Two real PostgreSQL sessions: the second blocks on the snapshot row, then finds it gone."""
    settings.BULK_SYNC_LIMIT = 2
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)
    for n in range(6):
        make_task(acme, objective=f"Raced {n}")
    operation = _confirm(_client(operator), "Raced")
    ready, written = threading.Barrier(2), []

    def write_out() -> None:
        try:
            ready.wait(10)
            written.append(bulk._write_results(operation.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=write_out) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(written) == [0, 6]
    assert BulkResult.objects.filter(operation=operation).count() == 6
    assert not BulkSnapshot.objects.filter(operation=operation).exists()


@pytest.mark.django_db
def test_a_crash_between_a_control_and_its_result_is_resumed_without_acting_twice(
    operator, acme, settings, monkeypatch
):
    settings.BULK_SYNC_LIMIT = 2
    monkeypatch.setattr(bulk, "CHUNK", 3)
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)
    tasks = [make_task(acme, objective=f"Crash {n}") for n in range(8)]
    operation = _confirm(_client(operator), "Crash")
    real_settle, calls = bulk._settle, []

    def settle_then_crash(result, settled, now):
        calls.append(result.task_id)
        if len(calls) == 5:  # the control of the 5th task committed; its result is never written
            raise SystemExit("runner killed")
        return real_settle(result, settled, now)

    monkeypatch.setattr(bulk, "_settle", settle_then_crash)
    with pytest.raises(SystemExit):
        bulk.bulk_run(operation.id, runner="victim")
    monkeypatch.setattr(bulk, "_settle", real_settle)
    operation.refresh_from_db()
    assert (operation.status, operation.runner, operation.done) == (BulkStatus.RUNNING, "victim", 3)
    # Another runner may not take it while the victim's heartbeat is fresh; past RUNNER_TIMEOUT it does.
    assert bulk.bulk_run(operation.id, runner="rescuer").runner == "victim"
    later = timezone.now() + bulk.RUNNER_TIMEOUT + timedelta(seconds=1)
    operation = bulk.bulk_run(operation.id, runner="rescuer", clock=lambda: later)
    assert (operation.status, operation.done, operation.applied, operation.stale) == (
        BulkStatus.DONE,
        8,
        8,
        0,
    )
    interrupted = BulkResult.objects.get(operation=operation, task_id=calls[4])
    assert interrupted.outcome == Outcome.APPLIED and "earlier runner" in interrupted.detail
    assert _bulk_events(operation) == {str(task.id): 1 for task in tasks}
    assert all(task.escalation_level == 1 for task in Task.objects.filter(tenant=acme))


SCRIPT = textwrap.dedent(
    """
    import django, sys
    django.setup()
    from runtime import bulk
    bulk.CHUNK = 3
    real_apply = bulk._apply
    def slow_apply(*args):
        import time
        time.sleep(0.05)  # so the test can watch the progress move, and kill it mid-way
        return real_apply(*args)
    bulk._apply = slow_apply
    print("started", flush=True)
    bulk.bulk_run(sys.argv[1], runner="victim-process")
    """
)


@pytest.mark.django_db(transaction=True)
def test_a_runner_process_killed_mid_way_is_taken_over_and_each_task_is_acted_on_once(
    operator, acme, settings, monkeypatch
):
    settings.BULK_SYNC_LIMIT = 5
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)
    tasks = [make_task(acme, objective=f"Killed {n}") for n in range(40)]
    client = _client(operator)
    operation = _confirm(client, "Killed")
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DEBUG": "1",
    }
    child = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(operation.id)], cwd=ROOT, env=env, stdout=subprocess.PIPE
    )
    try:

        def progressed() -> bool:
            operation.refresh_from_db()
            return operation.done >= 9

        wait_for(progressed, timeout=60, what="the runner's progress")
        page = client.get(f"/console/bulk/{operation.id}/").content.decode()
        assert f"{operation.done} of 40" in page or f"{operation.done + 3} of 40" in page  # mid-way, shown
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    operation.refresh_from_db()
    assert operation.status == BulkStatus.RUNNING and operation.runner == "victim-process"
    assert 9 <= operation.done < 40, operation.done
    time.sleep(0.1)
    later = timezone.now() + bulk.RUNNER_TIMEOUT + timedelta(seconds=1)
    operation = bulk.bulk_run(operation.id, runner="rescuer", clock=lambda: later)
    assert (operation.status, operation.done, operation.applied) == (BulkStatus.DONE, 40, 40)
    assert _bulk_events(operation) == {str(task.id): 1 for task in tasks}
    assert all(task.escalation_level == 1 for task in Task.objects.filter(tenant=acme))
