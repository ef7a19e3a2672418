"""A lease reclaimed from a SIGKILLed worker leaves a record an operator can see.

The first worker dies holding the task's lease; the second claims it once the
lease lapses. The task's history must say who took it, from whom, and which
fencing token went stale — in the database, the API and the console.
"""

from __future__ import annotations

import socket

import pytest
from django.test import Client

from audit.models import LeaseTakeover
from tasks.models import Lease
from tests.conftest import api_client_for, make_task
from tests.workflow import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def worker_name(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}"  # runtime.workers.worker_id() of that process


def test_a_lease_taken_over_from_a_killed_worker_is_recorded_and_shown(acme, operator, workers):
    task = make_task(
        acme,
        task_type="pay_invoice",
        objective="Pay INV-9",
        input={"invoice_id": "INV-9", "amount": "25.00", "currency": "EUR"},
    )
    first = workers(pause_after="step:pay")
    first.wait_paused()
    dead, stale = worker_name(first.process.pid), Lease.objects.get(task=task)
    assert (stale.worker_id, stale.token) == (dead, 1)
    first.kill()

    second = workers()
    alive = worker_name(second.process.pid)
    wait_for(lambda: LeaseTakeover.objects.filter(task=task).exists(), what="the second worker's claim")

    [takeover] = LeaseTakeover.objects.filter(task=task)
    assert (takeover.worker_id, takeover.previous_worker_id) == (alive, dead)
    assert (takeover.stale_token, takeover.token) == (1, 2)
    assert takeover.previous_expires_at == stale.expires_at
    assert takeover.previous_heartbeat_at == stale.heartbeat_at
    assert takeover.taken_at >= stale.expires_at

    shown = api_client_for(operator).get(f"/api/tasks/{task.id}/").json()["lease"]["takeovers"]
    assert [(t["worker_id"], t["previous_worker_id"], t["stale_token"], t["token"]) for t in shown] == [
        (alive, dead, 1, 2)
    ]
    assert shown[0]["heartbeat_age_seconds"] >= 1.0  # the dead worker's lease TTL

    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{task.id}/").content.decode()
    assert f"{alive} took over from {dead}" in page and "#1 → #2" in page
