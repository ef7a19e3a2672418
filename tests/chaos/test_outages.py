"""Outages of the payments system, against a real worker process.

Sends that fail (5xx) while lookups say "no such key" must not turn into a
resend storm: each resend waits for the send to be provably absent and then
for a growing, jittered backoff; after ``LEDGER_MAX_SENDS`` the task stops
and waits for an operator.
"""

from __future__ import annotations

import time

import pytest

from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_sends_failing_while_lookups_say_absent_back_off_and_stop_at_the_cap(acme, workers):
    Fault.objects.create(system="payments", operation="dispatch", kind="error", remaining=10_000)
    tasks = [
        make_task(
            acme,
            task_type="pay_invoice",
            objective=f"Pay INV-{n}",
            input={"invoice_id": f"INV-{n}", "amount": "5.00", "currency": "EUR"},
        )
        for n in range(4)
    ]
    started = time.monotonic()
    workers(
        extra_env={
            "CONNECTOR_TIMEOUT": "1",
            "CONNECTOR_MAX_IN_FLIGHT": "0.5",
            "LEDGER_LOOKUP_INTERVAL": "0.2",
            "LEDGER_RESEND_BACKOFF": "0.4",
            "LEDGER_MAX_SENDS": "3",
        }
    )

    def all_held() -> bool:
        return all(Task.objects.get(pk=t.pk).state == State.QUARANTINED for t in tasks)

    wait_for(all_held, timeout=60, what="every task to stop at the resend cap")
    elapsed = time.monotonic() - started
    time.sleep(1)  # nothing more is sent once they are held
    sends = 10_000 - Fault.objects.get().remaining
    assert sends == 3 * len(tasks), f"{sends} sends in {elapsed:.1f}s"
    assert not Effect.objects.exists()
    for task in tasks:
        task = Task.objects.get(pk=task.pk)
        assert (task.state_reason, task.escalation_level, task.escalated_to) == (
            "resend_limit_reached",
            1,
            "operator",
        )
        backoffs = TransitionEvent.objects.filter(task=task, trigger="resend_backoff").values_list(
            "reason", flat=True
        )
        assert len(backoffs) == 2 and all("send " in reason for reason in backoffs)
        assert verify_task(task) is None
