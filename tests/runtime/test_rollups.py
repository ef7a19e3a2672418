"""The maintained rollup of tasks per tenant and state (runtime.rollups), and the queue chips read from it."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from django.conf import settings
from django.test import Client

from runtime import rollups
from runtime.models import StateCount
from runtime.workers import rollups_refresh
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.workflow import database_url

pytestmark = pytest.mark.django_db

AT = datetime(2026, 12, 3, 12, 30, 5, tzinfo=UTC)


def listed(user) -> str:
    client = Client()
    client.force_login(user)
    return client.get("/console/").content.decode()


def test_a_refresh_counts_every_tenant_and_state_and_replaces_the_last_count(acme, globex):
    for _ in range(3):
        make_task(acme)
    done = make_task(acme)
    advance(done.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger="complete")
    make_task(globex)
    assert rollups.refresh(now=AT) == 3
    rows = {(row.tenant_id, row.state): (row.n, row.counted_at) for row in StateCount.objects.all()}
    assert rows == {
        (acme.id, State.READY): (3, AT),
        (acme.id, State.COMPLETED): (1, AT),
        (globex.id, State.READY): (1, AT),
    }
    # A transition writes nothing to the rollup: the counts move at the next refresh, not before.
    later = make_task(acme)
    advance(later.id, 1, State.COMPLETED, actor=Actor.worker("w"), trigger="complete")
    assert StateCount.objects.get(tenant_id=acme.id, state=State.COMPLETED).n == 1
    rollups.refresh()
    assert StateCount.objects.get(tenant_id=acme.id, state=State.COMPLETED).n == 2
    assert StateCount.objects.count() == 3


def test_reading_sums_the_users_tenants_per_label_with_the_time_of_the_count(acme, globex):
    make_task(acme)
    make_task(globex)
    assert rollups.state_counts([acme.id], [("ready", ["ready"])]) == {}  # never counted: nothing to say
    rollups.refresh(now=AT)
    found = rollups.state_counts([acme.id, globex.id], [("ready", ["ready"]), ("finished", ["completed"])])
    assert found == {"ready": rollups.Counted(2, AT), "finished": rollups.Counted(0, AT)}


def test_a_second_refresh_while_one_runs_skips_instead_of_colliding(acme):
    make_task(acme)
    with psycopg.connect(database_url(), autocommit=False) as other:
        other.execute("SELECT pg_advisory_xact_lock(%s)", [rollups._LOCK])
        assert rollups.refresh() is None
    assert rollups.refresh() == 1


def test_the_beat_recounts_on_its_own_schedule():
    assert settings.CELERY_BEAT_SCHEDULE["rollups"]["task"] == "runtime.rollups_refresh"
    assert rollups_refresh() == 0  # the Celery entry point: an empty table, no rows


def test_a_chip_past_the_cap_shows_the_exact_maintained_count_and_its_time(operator, acme, monkeypatch):
    monkeypatch.setattr("console.queue.COUNT_CAP", 2)
    for _ in range(5):
        make_task(acme)
    page = listed(operator)
    assert "counts over 2 as of" not in page  # never recounted yet: no exact number to show
    rollups.refresh(now=AT)
    page = listed(operator)
    assert 'state=ready" class="count"' in page and "<strong>5</strong>" in page
    assert 'counts over 2 as of <time datetime="2026-12-03T' in page
    make_task(acme)  # after the count: the chip says 5 as of the count, not a guess
    assert "<strong>5</strong>" in listed(operator)
    rollups.refresh()
    assert "<strong>6</strong>" in listed(operator)


def test_a_chip_under_the_cap_is_counted_live(operator, acme, monkeypatch):
    monkeypatch.setattr("console.queue.COUNT_CAP", 10)
    make_task(acme)
    rollups.refresh(now=AT)
    make_task(acme)
    page = listed(operator)
    assert "<strong>2</strong>" in page and "as of" not in page


def test_the_stored_gauges_reading_is_the_reading_itself(acme, globex, operator):
    from datetime import timedelta

    from django.utils import timezone

    from runtime import gauges
    from runtime.models import Alert, AlertKind

    waiting = make_task(acme)
    Task.objects.filter(pk=waiting.pk).update(
        state=State.WAITING_INPUT,
        wait_deadline=timezone.now() + timedelta(days=1),
        state_entered_at=timezone.now() - timedelta(hours=2),
    )
    make_task(globex)
    Alert.objects.create(
        tenant=acme, task=waiting, kind=AlertKind.QUARANTINE_OVERDUE, cause="c", raised_at=timezone.now()
    )
    assert rollups.gauges_reading() is None
    reading = gauges.read()
    rollups.store_gauges(reading)
    assert rollups.gauges_reading() == reading
    rollups.refresh()
    assert rollups.gauges_reading().read_at > reading.read_at
