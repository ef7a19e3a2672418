"""The alerts scan's plans at any table size: each classifier reads only the tasks in its own states (a
partial index, never the ended tasks), and raising never reads the alerts table it inserts into (the
first scan at a million tasks re-read it for every candidate task: minutes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import alerts
from runtime.models import AlertKind
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task

pytestmark = pytest.mark.django_db

# Each classifier on a task's state and age, and the partial index that holds only those tasks.
INDEXED = {
    AlertKind.NO_LIVE_LEASE: "task_runnable",
    AlertKind.WAIT_PAST_DEADLINE: "task_wait_deadline",
    AlertKind.UNKNOWN_OUTCOME_OVERDUE: "task_alert_overdue",
    AlertKind.QUARANTINE_OVERDUE: "task_alert_overdue",
    AlertKind.CANCEL_UNCONFIRMED: "task_alert_overdue",
}


def _raise_sql(kind: AlertKind) -> str:
    """The statement ``_raise`` runs for ``kind`` (run once, rolled back), as PostgreSQL received it."""
    now = timezone.now()
    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        alerts._raise(kind, alerts.CLASSIFIERS[kind](now), now)
        transaction.set_rollback(True)
    (sql,) = [query["sql"] for query in captured if query["sql"].startswith("INSERT")]
    return sql


def _plan(sql: str) -> str:
    with transaction.atomic(), connection.cursor() as cursor:
        # A handful of rows: ask which index it would use were the table large.
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(line for (line,) in cursor.fetchall())


@pytest.fixture
def ended_and_stuck(acme):
    """Ended tasks (which no classifier may read) beside one stuck task of each state-based kind."""
    old = timezone.now() - timedelta(days=3)
    for state in (State.COMPLETED, State.FAILED, State.CANCELED, State.EXPIRED):
        Task.objects.filter(pk=make_task(acme).pk).update(state=state, state_entered_at=old)
    for state in (State.OUTCOME_UNKNOWN, State.QUARANTINED, State.CANCEL_REQUESTED, State.READY):
        Task.objects.filter(pk=make_task(acme).pk).update(state=state, state_entered_at=old)
    Task.objects.filter(pk=make_task(acme).pk).update(state=State.WAITING_EXTERNAL, wait_deadline=old)


@pytest.mark.parametrize("kind", sorted(INDEXED))
def test_each_state_classifier_reads_its_partial_index_not_the_ended_tasks(ended_and_stuck, kind):
    plan = _plan(_raise_sql(kind))
    assert INDEXED[kind] in plan, plan
    assert "Seq Scan on tasks_task" not in plan, plan


def test_the_overdue_index_holds_only_tasks_in_the_states_the_scan_looks_at(ended_and_stuck):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'task_alert_overdue'")
        (definition,) = cursor.fetchone()
    assert "WHERE" in definition and "(state, state_entered_at)" in definition
    for state in ("cancel_requested", "outcome_unknown", "quarantined"):
        assert state in definition
    for state in ("completed", "failed", "canceled", "expired", "ready"):
        assert state not in definition


@pytest.mark.parametrize("kind", sorted(alerts.CLASSIFIERS))
def test_raising_never_reads_the_alerts_table_it_inserts_into(ended_and_stuck, kind):
    """With the statistics of an empty alerts table (a first scan), a ``NOT EXISTS`` on it was planned as a
    read of the whole table per candidate task, growing with every row the statement inserted. The open
    alert is left out by the unique index's conflict check instead: the plan reads no alerts at all,
    whatever the statistics say. (No ANALYZE here: its statistics outlive the test's rollback.)"""
    plan = _plan(_raise_sql(kind))
    scans = [line for line in plan.splitlines() if "Scan" in line and "runtime_alert" in line]
    assert not scans, plan


def test_an_open_alert_is_still_raised_once_across_scans(ended_and_stuck):
    first = alerts.scan().as_dict()
    # Ready, waiting past its deadline, outcome unknown, quarantined, and the cancel requested twice (not
    # confirmed, and runnable with no lease).
    assert first["raised"] == 6
    assert alerts.scan().as_dict()["raised"] == 0
