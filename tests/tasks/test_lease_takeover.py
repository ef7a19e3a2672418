"""Lease takeovers are recorded in the task's history: who took it, from whom, which token went stale.

In-process claims on PostgreSQL; ``tests/chaos/test_lease_takeover.py`` does
the same with a SIGKILLed worker process.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import LeaseTakeover
from tasks import leases
from tasks.models import Lease, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import api_client_for, make_task, progress

pytestmark = pytest.mark.django_db

SHORT_TTL = timedelta(milliseconds=300)


def claim(task: Task, worker: str, ttl: timedelta = leases.DEFAULT_TTL) -> leases.Held | None:
    return leases.claim(task.id, worker_id=worker, region="default", ttl=ttl)


def lapse() -> None:
    time.sleep(SHORT_TTL.total_seconds() + 0.1)


def test_claiming_a_lease_that_lapsed_in_another_workers_hands_records_the_takeover(acme):
    task = make_task(acme)
    assert claim(task, "w1", SHORT_TTL) is not None
    stale = Lease.objects.get(task=task)
    lapse()

    held = leases.claim_next(worker_id="w2", region="default")

    assert [(h.worker_id, h.token) for h in held] == [("w2", 2)]
    [takeover] = LeaseTakeover.objects.filter(task=task)
    assert (takeover.worker_id, takeover.token, takeover.previous_worker_id, takeover.stale_token) == (
        "w2",
        2,
        "w1",
        1,
    )
    assert (takeover.previous_heartbeat_at, takeover.previous_expires_at) == (
        stale.heartbeat_at,
        stale.expires_at,
    )
    assert takeover.taken_at == Lease.objects.get(task=task).acquired_at


def test_a_lease_released_by_its_holder_is_handed_on_without_a_takeover(acme):
    task = make_task(acme)
    held = claim(task, "w1")
    leases.release(held)

    assert claim(task, "w2") is not None
    assert not LeaseTakeover.objects.filter(task=task).exists()


def test_a_worker_reclaiming_its_own_lapsed_lease_records_no_takeover(acme):
    task = make_task(acme)
    claim(task, "w1", SHORT_TTL)
    lapse()

    assert claim(task, "w1") == leases.Held(task.id, "w1", 2)
    assert not LeaseTakeover.objects.filter(task=task).exists()


def test_a_refused_claim_records_nothing(acme):
    task = make_task(acme)
    claim(task, "w1")
    assert claim(task, "w2") is None
    assert not LeaseTakeover.objects.filter(task=task).exists()


def test_takeover_records_refuse_updates_and_deletes(acme):
    task = make_task(acme)
    claim(task, "w1", SHORT_TTL)
    lapse()
    claim(task, "w2")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        LeaseTakeover.objects.filter(task=task).update(previous_worker_id="nobody")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        LeaseTakeover.objects.filter(task=task).delete()
    assert LeaseTakeover.objects.get(task=task).previous_worker_id == "w1"


def test_the_task_detail_and_page_show_takeovers_newest_first(acme, operator):
    task = make_task(acme)
    claim(task, "w1", SHORT_TTL)
    lapse()
    claim(task, "w2", SHORT_TTL)
    lapse()
    claim(task, "w3")

    lease = api_client_for(operator).get(f"/api/tasks/{task.id}/").json()["lease"]
    assert [
        (t["worker_id"], t["previous_worker_id"], t["stale_token"], t["token"]) for t in lease["takeovers"]
    ] == [
        ("w3", "w2", 2, 3),
        ("w2", "w1", 1, 2),
    ]
    assert lease["takeovers"][0]["heartbeat_age_seconds"] >= SHORT_TTL.total_seconds()

    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{task.id}/").content.decode()
    assert page.index("w3 took over from w2") < page.index("w2 took over from w1")


def test_the_console_timeline_shows_a_takeover_between_the_events_it_came_between(acme, operator):
    task = make_task(acme)
    claim(task, "w1", SHORT_TTL)
    lapse()
    assert claim(task, "w2") is not None
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w2"), progress=progress("s1"))

    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{task.id}/").content.decode()
    timeline = page[page.index('id="timeline"') :]
    shown = "Lease taken over: w2 took over from w1 (lease #1 → #2"
    assert shown in timeline
    # Newest first: the step (v2) above the takeover, the takeover above the creation (v1).
    assert timeline.index('value="2"') < timeline.index(shown) < timeline.index('value="1"')


def test_an_ordinary_claim_never_touches_the_takeover_chain(acme):
    task, handed_on = make_task(acme), make_task(acme)
    leases.release(claim(handed_on, "w1"))
    with CaptureQueriesContext(connection) as fresh:
        assert claim(task, "w1") is not None
    with CaptureQueriesContext(connection) as handed:
        assert claim(handed_on, "w2") is not None
    for sql in [q["sql"] for q in (*fresh.captured_queries, *handed.captured_queries)]:
        assert "takeover" not in sql  # neither the head nor the takeover table: only a takeover pays
