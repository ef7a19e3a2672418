"""``run_worker --sweep``'s chores: the sweep's waits every round, beat's slower chores at beat's pace."""

from __future__ import annotations

from collections import Counter

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext

from approvals.models import ApprovalRequest
from runtime import rollout
from runtime.management.commands import run_worker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def calls(monkeypatch):
    """Which chores ran, by name (each replaced by a counter; the sweep runs for real minus step 4)."""
    ran: Counter[str] = Counter()

    def counting(name, result=0):
        def chore(*args, **kwargs):
            ran[name] += 1
            return result

        return chore

    monkeypatch.setattr(run_worker.approvals, "expire_pending", counting("approvals"))
    monkeypatch.setattr(run_worker.alerts, "scan", counting("alerts"))
    monkeypatch.setattr(run_worker.rollups, "refresh", counting("rollups"))
    monkeypatch.setattr(run_worker.reconcile, "reconcile_unknown", counting("reconcile"))
    monkeypatch.setattr(run_worker.bulk, "run_pending", counting("bulk"))
    monkeypatch.setattr(rollout, "lift_key_scheme_quarantines", counting("lift"))
    return ran


def test_each_round_sweeps_and_reconciles_and_the_slower_chores_keep_beats_pace(db, calls):
    clock = Clock()
    chores = run_worker.Chores("w-chores", "default", with_sweep=True, push_inline=False, clock=clock)
    for _ in range(3):  # three rounds within a second, as a busy worker's loop runs them
        chores()
        clock.now += 0.4
    assert (calls["reconcile"], calls["bulk"]) == (3, 3)
    assert (calls["approvals"], calls["lift"], calls["alerts"], calls["rollups"]) == (1, 1, 1, 1)

    clock.now += settings.CELERY_BEAT_SCHEDULE["expire-approvals"]["schedule"]
    chores()
    assert calls["approvals"] == 2
    assert calls["lift"] == 2  # the sweep's interval (5 s) is shorter than approvals' (30 s)


def test_a_second_round_within_beats_interval_reads_no_approval_requests(db):
    clock = Clock()
    chores = run_worker.Chores("w-chores", "default", with_sweep=True, push_inline=False, clock=clock)
    table = ApprovalRequest._meta.db_table
    with CaptureQueriesContext(connection) as first:
        chores()
    clock.now += 1.0
    with CaptureQueriesContext(connection) as second:
        chores()
    assert [q for q in first.captured_queries if table in q["sql"]]
    assert not [q for q in second.captured_queries if table in q["sql"]]
    assert len(second.captured_queries) < len(first.captured_queries)


def test_without_the_sweep_only_bulk_operations_run(db, calls):
    chores = run_worker.Chores("w-chores", "default", with_sweep=False, push_inline=False, clock=Clock())
    chores()
    assert calls == Counter(bulk=1)
