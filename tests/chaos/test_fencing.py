"""A worker frozen (SIGSTOP) past its lease while another takes its task over, then thawed (SIGCONT).

Whatever the boundary it froze at, the thawed worker must not write to the
ledger nor send anything for the task it lost: the side effect reaches the
payments system exactly once (counting deliveries, not effects, so a
system's own deduplication cannot hide a second send), the task completes
once, and its audit chain verifies.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import WorkerProcess, state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
FAST = {
    "CONNECTOR_TIMEOUT": "1",
    "CONNECTOR_MAX_IN_FLIGHT": "2",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
    "UNKNOWN_OUTCOME_ESCALATE_AFTER": "600",
}
FROZEN = {**FAST, "DURABLE_PAUSE_MODE": "stop"}


def invoice_task(tenant) -> Task:
    return make_task(
        tenant,
        task_type="pay_invoice",
        objective="Pay INV-9",
        input={"invoice_id": "INV-9", "amount": "12.34", "currency": "EUR"},
    )


def freeze_at(workers, point: str, *, lease_ttl: float = 1.0) -> WorkerProcess:
    worker = workers(pause_after=point, lease_ttl=lease_ttl, extra_env=FROZEN)
    worker.wait_paused()
    wait_for(lambda: _stopped(worker), timeout=10, what="the worker to stop itself")
    return worker


def _stopped(worker: WorkerProcess) -> bool:
    with open(f"/proc/{worker.process.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def thaw(worker: WorkerProcess) -> None:
    os.kill(worker.process.pid, signal.SIGCONT)


def deliveries() -> int:
    return sum(Effect.objects.filter(system="payments").values_list("deliveries", flat=True))


def assert_paid_once_and_completed_once(task: Task) -> None:
    wait_for(lambda: state_of(task)[0] == State.COMPLETED, what="completion")
    action = Action.objects.get(task=task)
    assert action.dispatch_state in (DispatchState.SUCCEEDED, DispatchState.RECONCILED_SUCCEEDED)
    [effect] = Effect.objects.filter(system="payments")
    assert (effect.idempotency_key, effect.deliveries) == (action.idempotency_key, 1)
    assert TransitionEvent.objects.filter(task=task, trigger="complete").count() == 1
    assert verify_task(Task.objects.get(pk=task.pk)) is None


@pytest.mark.parametrize(
    "point",
    [
        "step:pay",  # right after the intent committed
        "claiming:payments",  # about to claim the send
        "sending:payments",  # claimed, about to send
        "dispatched:payments",  # sent and answered, about to record the answer
    ],
)
def test_a_worker_thawed_after_losing_its_task_writes_and_sends_nothing(acme, workers, point):
    task = invoice_task(acme)
    frozen = freeze_at(workers, point)
    workers(lease_ttl=5, extra_env=FAST)  # takes the task over once the frozen worker's lease lapses
    assert_paid_once_and_completed_once(task)
    events = TransitionEvent.objects.filter(task=task).count()

    thaw(frozen)
    time.sleep(2)  # the thawed worker carries on from where it froze
    assert frozen.process.poll() is None  # it lost a task, not its life
    assert_paid_once_and_completed_once(task)
    assert TransitionEvent.objects.filter(task=task).count() == events  # and wrote nothing


def test_a_thawed_worker_cannot_claim_a_send_while_the_new_owner_holds_the_task(acme, workers):
    """The race that fencing at the task row alone lost: the old owner thaws between the new
    owner's takeover and the new owner's own claim of the send."""
    task = invoice_task(acme)
    old = freeze_at(workers, "claiming:payments")
    new = freeze_at(workers, "claiming:payments", lease_ttl=30)  # holds the task, frozen before its claim
    lease = Task.objects.get(pk=task.pk).lease
    assert (lease.worker_id.rsplit(":", 1)[1], lease.token) == (str(new.process.pid), 2)

    thaw(old)
    time.sleep(2)
    assert old.process.poll() is None
    assert Action.objects.get(task=task).dispatch_state == DispatchState.INTENDED  # not claimed...
    assert not Effect.objects.exists()  # ...and not sent by the worker that lost the task

    thaw(new)
    assert_paid_once_and_completed_once(task)
    assert Action.objects.get(task=task).attempts == 1
