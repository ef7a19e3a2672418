"""Leases on the database's clock: a worker whose own clock is wrong neither steals nor outlives leases.

A worker's clock is injected here (``timezone.now`` and ``time.time`` ten
minutes off): the claim, the heartbeat, the release and the fence on a commit
must read the time from PostgreSQL, and the skew check must refuse to claim
for a worker too far off. ``tests/chaos/test_clock_skew.py`` runs the same
attack with real processes under libfaketime.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from unittest import mock

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from config import metrics as metrics_config
from tasks import leases, liveness
from tasks.models import Lease, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

REGION = "default"
TTL = timedelta(seconds=30)
AHEAD = timedelta(minutes=10)


def database_now() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now: datetime = cursor.fetchone()[0]
    return now


@pytest.fixture
def clock_off() -> Iterator[object]:
    """Run the rest as a worker whose wall clock is ``off`` the database's (default: ten minutes ahead)."""
    real = timezone.now
    patches: list[mock._patch] = []

    def set_off(off: timedelta = AHEAD) -> None:
        patches.append(mock.patch("django.utils.timezone.now", lambda: real() + off))
        patches[-1].start()

    yield set_off
    for patch in reversed(patches):
        patch.stop()


@pytest.fixture(autouse=True)
def unmeasured() -> Iterator[None]:
    """No skew measured in this process before or after a test (each measures its own)."""
    liveness.forget_skew()
    yield
    liveness.forget_skew()


def assert_expires_a_ttl_from_database_now(task_id: object) -> None:
    left = Lease.objects.get(task_id=task_id).expires_at - database_now()
    assert timedelta(seconds=25) < left <= TTL, f"the lease expires {left} from the database's now"


def test_a_claimer_whose_clock_runs_ten_minutes_ahead_takes_no_lease_from_a_live_holder(acme, clock_off):
    task = make_task(acme)
    assert leases.claim(task.id, worker_id="right", region=REGION, ttl=TTL) is not None
    clock_off(AHEAD)
    assert leases.claim_next(worker_id="ahead", region=REGION, limit=5, ttl=TTL) == []
    assert leases.claim(task.id, worker_id="ahead", region=REGION, ttl=TTL) is None
    assert Lease.objects.get(task=task).worker_id == "right"


def test_a_lease_claimed_by_a_clock_ten_minutes_ahead_expires_one_ttl_after_the_database_now(acme, clock_off):
    task = make_task(acme)
    clock_off(AHEAD)
    [held] = leases.claim_next(worker_id="ahead", region=REGION, ttl=TTL)
    assert held.task_id == task.id
    assert_expires_a_ttl_from_database_now(task.id)


def test_a_heartbeat_from_a_clock_ten_minutes_ahead_extends_one_ttl_from_the_database_now(acme, clock_off):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="ahead", region=REGION, ttl=TTL)
    assert held is not None
    clock_off(AHEAD)
    assert leases.heartbeat_all([held], ttl=TTL) == set()
    assert_expires_a_ttl_from_database_now(task.id)
    assert leases.heartbeat(held, ttl=TTL) is True
    assert_expires_a_ttl_from_database_now(task.id)


def test_a_heartbeat_from_a_clock_ten_minutes_behind_does_not_revive_a_lapsed_lease(acme, clock_off):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="behind", region=REGION, ttl=TTL)
    assert held is not None
    Lease.objects.filter(task=task).update(expires_at=database_now() - timedelta(seconds=1))
    clock_off(-AHEAD)
    assert leases.heartbeat_all([held], ttl=TTL) == {task.id}
    assert leases.heartbeat(held, ttl=TTL) is False


def test_a_release_from_a_clock_ten_minutes_ahead_frees_the_task_at_once(acme, clock_off):
    task = make_task(acme)
    clock_off(AHEAD)
    held = leases.claim(task.id, worker_id="ahead", region=REGION, ttl=TTL)
    assert held is not None
    leases.release(held)
    clock_off(timedelta(0))
    assert leases.claim(task.id, worker_id="right", region=REGION, ttl=TTL) is not None


def test_a_holder_whose_clock_runs_ten_minutes_ahead_commits_under_its_live_lease(acme, clock_off):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="ahead", region=REGION, ttl=TTL)
    assert held is not None
    clock_off(AHEAD)
    advance(
        task.id, task.state_version, State.READY, actor=Actor.worker("ahead"), trigger=Trigger.STEP,
        progress=progress("step"), lease=held,
    )  # fmt: skip
    assert Task.objects.get(pk=task.pk).state_version == task.state_version + 1


def test_a_worker_whose_clock_is_beyond_the_maximum_skew_refuses_to_claim_and_says_why(
    acme, settings, caplog
):
    settings.WORKER_MAX_CLOCK_SKEW = 5.0
    task = make_task(acme)
    with caplog.at_level(logging.WARNING, logger="tasks"):
        skew = liveness.measure_skew(clock=lambda: time.time() + AHEAD.total_seconds())
        assert abs(skew - AHEAD.total_seconds()) < 2
        assert leases.claim_next(worker_id="ahead", region=REGION, ttl=TTL) == []
        assert leases.claim(task.id, worker_id="ahead", region=REGION, ttl=TTL) is None
    assert not Lease.objects.filter(task=task).exists()
    said = caplog.text
    assert "clock" in said and "WORKER_MAX_CLOCK_SKEW" in said and "refus" in said


def test_a_worker_ten_minutes_behind_refuses_to_claim(acme, settings):
    settings.WORKER_MAX_CLOCK_SKEW = 5.0
    make_task(acme)
    assert liveness.measure_skew(clock=lambda: time.time() - AHEAD.total_seconds()) < -590
    assert leases.claim_next(worker_id="behind", region=REGION, ttl=TTL) == []


def test_a_worker_whose_clock_is_set_right_again_claims_after_its_next_measurement(acme, settings):
    settings.WORKER_MAX_CLOCK_SKEW = 5.0
    task = make_task(acme)
    liveness.measure_skew(clock=lambda: time.time() + AHEAD.total_seconds())
    assert leases.claim_next(worker_id="w", region=REGION, ttl=TTL) == []
    assert abs(liveness.measure_skew()) < 1
    assert [held.task_id for held in leases.claim_next(worker_id="w", region=REGION, ttl=TTL)] == [task.id]


def test_the_skew_and_the_refused_claims_are_shown_on_the_metrics_endpoint(acme, settings, client):
    settings.WORKER_MAX_CLOCK_SKEW = 5.0
    settings.METRICS_CACHE_SECONDS = 0
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_IPS = ["127.0.0.1/32"]
    assert metrics_config.configure()
    make_task(acme)

    def scraped(name: str, **labels: str) -> float | None:
        response = client.get("/metrics")
        assert response.status_code == 200, response.content
        for family in text_string_to_metric_families(response.content.decode()):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    return float(sample.value)
        return None

    counted = {"worker": "metrics-ahead", "reason": "clock_skew"}
    refused_before = scraped("durable_claims_refused_total", **counted) or 0.0
    liveness.measure_skew(clock=lambda: time.time() + AHEAD.total_seconds())
    assert leases.claim_next(worker_id="metrics-ahead", region=REGION, ttl=TTL) == []
    skew = scraped("durable_worker_clock_skew_seconds")
    assert skew is not None and abs(skew - AHEAD.total_seconds()) < 2
    refused = scraped("durable_claims_refused_total", **counted)
    assert refused == refused_before + 1


def test_a_worker_whose_clock_is_off_runs_no_chores_by_it(db, settings):
    """The sweep expires waits and the alert scan ages tasks by the worker's clock: a worker that may not
    claim for its clock runs neither."""
    from django.db import connections

    from runtime.loop import Loop

    def chores_run(limit: float) -> int:
        settings.WORKER_MAX_CLOCK_SKEW = limit
        ran: list[int] = []
        rounds: list[int] = []
        loop = Loop("w-skewed", REGION, 1, TTL, idle=0.01, chores=lambda: ran.append(1) or 0, chore_every=0)
        try:
            loop.run(should_stop=lambda: rounds.append(1) or len(rounds) > 5)
        finally:
            liveness.stop()
            connections.close_all()
        return len(ran)

    assert chores_run(-1.0) == 0  # a limit no measured clock is within: this worker's clock is "off"
    assert chores_run(5.0) > 0
