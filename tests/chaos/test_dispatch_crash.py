"""Real workers SIGKILLed around a side effect: before the send, after it, after reconciling.

Whatever the moment of death, the payment must exist exactly once in the
payments system and the ledger must end up saying so.
"""

from __future__ import annotations

import pytest

from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from runtime import controls
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
FAST = {"CONNECTOR_TIMEOUT": "0.5", "UNKNOWN_OUTCOME_ESCALATE_AFTER": "600"}


def invoice_task(tenant) -> Task:
    return make_task(
        tenant,
        task_type="pay_invoice",
        objective="Pay INV-1",
        input={"invoice_id": "INV-1", "amount": "25.00", "currency": "EUR"},
    )


def payments() -> list[Effect]:
    return list(Effect.objects.filter(system="payments"))


def assert_paid_once(task: Task) -> None:
    wait_for(lambda: state_of(task)[0] == State.COMPLETED, what="completion")
    action = Action.objects.get(task=task)
    [effect] = payments()
    assert effect.idempotency_key == action.idempotency_key
    assert action.dispatch_state in (DispatchState.SUCCEEDED, DispatchState.RECONCILED_SUCCEEDED)
    assert Task.objects.get(pk=task.pk).outcome["payment_ref"] == str(effect.pk) == action.external_ref
    assert verify_task(Task.objects.get(pk=task.pk)) is None


def test_killed_after_committing_the_intent_the_payment_is_sent_once_by_the_next_worker(acme, workers):
    task = invoice_task(acme)
    first = workers(pause_after="step:pay", extra_env=FAST)
    first.wait_paused()
    first.kill()
    assert Action.objects.get(task=task).dispatch_state == DispatchState.INTENDED
    assert payments() == []

    workers(extra_env=FAST)
    assert_paid_once(task)
    assert Action.objects.get(task=task).attempts == 1


def test_killed_after_the_send_before_recording_it_the_payment_is_reconciled_not_resent(acme, workers):
    task = invoice_task(acme)
    first = workers(pause_after="dispatched:payments", extra_env=FAST)
    first.wait_paused()
    first.kill()
    assert Action.objects.get(task=task).dispatch_state == DispatchState.DISPATCHING  # in doubt
    assert len(payments()) == 1

    workers(extra_env=FAST)
    assert_paid_once(task)
    action = Action.objects.get(task=task)
    assert (action.dispatch_state, action.attempts) == (DispatchState.RECONCILED_SUCCEEDED, 1)


def test_killed_right_after_reconciling_the_next_worker_records_the_payment(acme, workers):
    Fault.objects.create(system="payments", operation="dispatch", kind="timeout", params={"seconds": 1})
    task = invoice_task(acme)
    first = workers(pause_after="reconciled", extra_env=FAST)
    first.wait_paused()
    first.kill()
    assert state_of(task)[0] == State.READY
    assert Action.objects.get(task=task).dispatch_state == DispatchState.RECONCILED_SUCCEEDED

    workers(extra_env=FAST)
    assert_paid_once(task)


def test_a_cancel_while_the_send_is_in_flight_reports_the_payment_it_could_not_undo(acme, operator, workers):
    task = invoice_task(acme)
    first = workers(pause_after="dispatched:payments", extra_env=FAST)
    first.wait_paused()
    controls.task_control(
        Task.objects.get(pk=task.pk),
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=state_of(task)[1],
        reason="customer withdrew",
    )
    first.kill()

    workers(extra_env=FAST)
    wait_for(lambda: state_of(task)[0] == State.CANCELED, what="the cancel to complete")
    action = Action.objects.get(task=task)
    [effect] = payments()
    assert action.dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    assert Task.objects.get(pk=task.pk).outcome["effects_not_undone"] == [
        {
            "action": action.idempotency_key,
            "connector": "payments",
            "external_ref": str(effect.pk),
            "step": "pay",
            "compensation": "",
        }
    ]
