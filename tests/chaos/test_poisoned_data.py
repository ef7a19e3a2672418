"""A real worker process against an order system serving a record PostgreSQL cannot hold.

Before: the NUL in one order's status reached a commit, the database refused
it, the error killed the worker, and the task stayed ``ready`` for the next
worker to die on — healthy tasks starved. Now the poisoned task is quarantined
naming the system, record and field, the worker lives, and the healthy tasks finish.

The order system is a stand-in (``tests.standin``): the sandbox stores records
in a JSON column, which cannot hold the NUL under test.
"""

from __future__ import annotations

import time

import pytest

from audit.models import TransitionEvent
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.standin import record_server
from tests.workflow import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
HEALTHY = 10


def lookup(tenant, order_id: str) -> Task:
    return make_task(
        tenant, task_type="order_lookup", objective=f"Look up {order_id}", input={"order_id": order_id}
    )


def test_an_order_with_a_nul_is_quarantined_while_the_worker_lives_and_finishes_healthy_tasks(acme, workers):
    with record_server() as orders:
        orders.put("POISON", {"status": "deliv\x00ered", "total": "10.00"})
        poisoned = lookup(acme, "POISON")  # first in line: claimed in the worker's first batch
        healthy = []
        for index in range(HEALTHY):
            orders.put(f"OK-{index}", {"status": "delivered", "total": "10.00"})
            healthy.append(lookup(acme, f"OK-{index}"))

        started = time.monotonic()
        worker = workers(extra_env={"CONNECTOR_ORDERS_URL": orders.url})
        ids = [task.pk for task in healthy]

        def settled() -> bool:
            if worker.process.poll() is not None:
                raise AssertionError(f"the worker died:\n{worker.process.stdout.read()}")
            done = Task.objects.filter(pk__in=ids, state=State.COMPLETED).count() == HEALTHY
            return done and Task.objects.get(pk=poisoned.pk).state == State.QUARANTINED

        wait_for(settled, timeout=30, what="the healthy tasks to complete and the poisoned one to be held")
        elapsed = time.monotonic() - started

    assert worker.process.poll() is None
    assert elapsed < 30
    held = Task.objects.get(pk=poisoned.pk)
    assert held.state_reason == "evidence_unstorable"
    reason = TransitionEvent.objects.filter(task=held).latest("state_version").reason
    assert reason == "orders record 'POISON': field 'status' contains a NUL character (at position 5)"
    assert all(task.outcome["order_status"] == "delivered" for task in Task.objects.filter(pk__in=ids))
