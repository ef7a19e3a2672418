"""A lease reclaimed from a SIGKILLed worker: taken at once, and recorded where an operator can see it.

The first worker dies holding the task's lease, with a 30 s TTL. Its process's
liveness lock (``tasks.liveness``) dies with it, so a second worker, already
polling, takes the task over within a second instead of after the TTL. The
task's history must say who took it, from whom, and which fencing token went
stale — in the database, the API and the console.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from audit.chain import GENESIS
from audit.keys import current_chain_key
from audit.models import LeaseTakeover
from tasks import liveness
from tasks.models import Lease, Task
from tests.audit.owner import triggers_off
from tests.conftest import api_client_for, make_task
from tests.workflow import sessions_named, wait_for

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
    first = workers(pause_after="step:pay", lease_ttl=30.0)
    first.wait_paused()
    dead = worker_name(first.process.pid)
    second = workers(lease_ttl=30.0)  # polling (every 0.1 s) before the kill
    alive = worker_name(second.process.pid)
    wait_for(lambda: sessions_named(liveness.APPLICATION_NAME) == 2, what="the second worker to start")
    assert Lease.objects.get(task=task).worker_id == dead
    killed = datetime.now(UTC)
    first.kill()
    wait_for(lambda: LeaseTakeover.objects.filter(task=task).exists(), what="the second worker's claim")

    [takeover] = LeaseTakeover.objects.filter(task=task)
    took = (takeover.taken_at - killed).total_seconds()
    assert took < 1.0, f"taken over {took:.2f} s after the kill, with a 30 s lease TTL"
    assert (takeover.worker_id, takeover.previous_worker_id) == (alive, dead)
    assert (takeover.stale_token, takeover.token) == (1, 2)
    # The record describes the dead worker's lease as it was taken: last beaten before the kill (a
    # read of the row after the kill could already see the new lease), and still live for its TTL.
    assert takeover.previous_heartbeat_at <= killed
    assert takeover.taken_at < takeover.previous_expires_at  # long before the TTL ran out

    shown = api_client_for(operator).get(f"/api/tasks/{task.id}/").json()["lease"]["takeovers"]
    assert [(t["worker_id"], t["previous_worker_id"], t["stale_token"], t["token"]) for t in shown] == [
        (alive, dead, 1, 2)
    ]
    assert shown[0]["heartbeat_age_seconds"] >= 0

    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{task.id}/").content.decode()
    assert f"{alive} took over from {dead}" in page and "#1 → #2" in page
    timeline = page[page.index('id="timeline"') :]
    assert f"Lease taken over: {alive} took over from {dead} (lease #1 → #2" in timeline


def test_a_takeover_after_sigkill_is_on_the_tasks_chain_and_verify_audit_fails_without_it(
    acme, workers, capsys
):
    task = make_task(
        acme,
        task_type="pay_invoice",
        objective="Pay INV-10",
        input={"invoice_id": "INV-10", "amount": "25.00", "currency": "EUR"},
    )
    first = workers(pause_after="step:pay", lease_ttl=30.0)
    first.wait_paused()
    workers(lease_ttl=30.0)  # polling before the kill, as above
    wait_for(lambda: sessions_named(liveness.APPLICATION_NAME) == 2, what="the second worker to start")
    first.kill()
    wait_for(lambda: LeaseTakeover.objects.filter(task=task).exists(), what="the second worker's claim")

    [takeover] = LeaseTakeover.objects.filter(task=task)
    assert (takeover.prev_hash, takeover.key_id) == (GENESIS, current_chain_key().id)
    assert Task.objects.get(pk=task.pk).takeover_head == takeover.hash
    call_command("verify_audit", "--task", str(task.id))  # clean: raises on any break

    with triggers_off("audit_leasetakeover") as cursor:
        cursor.execute("DELETE FROM audit_leasetakeover WHERE id = %s", [takeover.id])
    with pytest.raises(CommandError):
        call_command("verify_audit", "--task", str(task.id))
    assert "task's takeover head does not match the newest takeover" in capsys.readouterr().err
