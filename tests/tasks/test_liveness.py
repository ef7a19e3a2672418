"""Liveness locks: a live lease whose holder's session is gone is claimable at once, and fenced.

The holder here is a plain PostgreSQL session holding an advisory lock, as a
worker process's liveness connection does (``tasks.liveness``); closing it is
what the kernel does to a SIGKILLed process's sockets.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from audit.models import LeaseTakeover
from tasks import leases, liveness
from tasks.exceptions import LeaseLost
from tasks.models import Lease
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.workflow import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

LONG = timedelta(minutes=10)  # nothing here may wait for a TTL


class Holder:
    """Another process's liveness session: it holds ``key`` until closed."""

    def __init__(self, key: int):
        self.key = key
        self.conn = psycopg.connect(**liveness._connect_params())
        self.conn.execute("SELECT pg_advisory_lock(%s)", (key,))

    def close(self) -> None:
        """End the session; the server releases the lock as its backend exits, a moment later."""
        self.conn.close()
        wait_for(lambda: not self._still_held(), timeout=5, what="the server to drop the session's lock")

    def _still_held(self) -> bool:
        with connection.cursor() as cursor:
            held = f"SELECT count(*) FROM ({liveness.HELD_KEYS_SQL}) k(key) WHERE key = %s"
            cursor.execute(held, [self.key])
            return bool(cursor.fetchone()[0])


def held_by(holder: Holder, task) -> leases.Held:
    lease = leases.claim(task.id, worker_id="dead-or-alive", region="default", ttl=LONG)
    assert lease is not None
    Lease.objects.filter(task=task).update(holder_key=holder.key)  # as that process stamped it
    return lease


def test_a_lease_whose_holder_lives_is_not_taken_before_its_ttl(acme):
    task = make_task(acme)
    holder = Holder(7_000_000_001)
    try:
        held_by(holder, task)
        assert leases.claim_next(worker_id="other", region="default") == []
        assert leases.claim(task.id, worker_id="other", region="default") is None
    finally:
        holder.close()


def test_a_lease_whose_holder_session_ended_is_taken_at_once_and_the_old_holder_is_fenced(acme):
    task = make_task(acme)
    holder = Holder(7_000_000_002)
    stale = held_by(holder, task)
    holder.close()  # the process died: its session, and its lock, are gone

    [taken] = leases.claim_next(worker_id="other", region="default", ttl=LONG)
    assert (taken.task_id, taken.token) == (task.id, stale.token + 1)
    lease = Lease.objects.get(task=task)
    assert lease.expires_at > timezone.now() + timedelta(minutes=9)  # taken long before the old TTL
    [record] = LeaseTakeover.objects.filter(task=task)
    assert (record.previous_worker_id, record.stale_token) == ("dead-or-alive", stale.token)
    with pytest.raises(LeaseLost):
        advance(task.id, 1, State.QUARANTINED, actor=Actor.worker("dead-or-alive"), lease=stale)


def test_the_queue_shows_a_dead_holders_lease_as_not_live(acme):
    task = make_task(acme)
    holder = Holder(7_000_000_003)
    held_by(holder, task)
    live = leases.live_lease_exists(timezone.now())
    assert task.__class__.objects.filter(pk=task.pk).filter(live).exists()
    holder.close()
    assert not task.__class__.objects.filter(pk=task.pk).filter(live).exists()


def test_this_process_holds_its_own_lock_and_stamps_its_leases(acme):
    key = liveness.ensure()
    assert key is not None and liveness.healthy()
    task = make_task(acme)
    leases.claim(task.id, worker_id="me", region="default")
    assert Lease.objects.get(task=task).holder_key == key
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM ({liveness.HELD_KEYS_SQL}) k(key) WHERE key = %s", [key])
        assert cursor.fetchone()[0] == 1
    liveness.stop()
    assert liveness.key() is None  # a stopped process stamps nothing it no longer holds
