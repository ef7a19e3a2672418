"""What "absent" means: not found once the send can no longer land — and what follows from it.

A lookup that finds nothing is only trusted after ``CONNECTOR_MAX_IN_FLIGHT``
since the send was claimed; an absent effect is resent with backoff and only
so many times; an effect that lands after its task ended amends the report.
The payments system here commits late on purpose (``latency`` faults sleep
before committing), as real ones do after the client has given up.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest

from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from runtime import controls, runner
from runtime.reconcile import recheck_absent, reconcile_unknown, resend_backoff
from runtime.sweep import sweep
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.LEDGER_RESEND_BACKOFF = 0.05
    settings.LATE_EFFECT_RECHECK_EVERY = 0


def invoice_task(tenant) -> Task:
    return make_task(
        tenant,
        task_type="pay_invoice",
        objective="Pay INV-7",
        input={"invoice_id": "INV-7", "amount": "12.34", "currency": "EUR"},
    )


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def cancel(task: Task, operator) -> Task:
    return controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="customer withdrew",
    ).task


def late_payment(ms: int) -> None:
    """The next payment commits ``ms`` after it arrives: long after the caller timed out."""
    Fault.objects.create(system="payments", operation="dispatch", kind="latency", params={"ms": ms})


def wait_until(predicate, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def landed(task: Task) -> bool:
    """The task's payment has reached the payments system (by its key: a late request of an
    earlier test may still land in the live server after that test)."""
    key = Action.objects.get(task=task).idempotency_key
    return Effect.objects.filter(idempotency_key=key).exists()


def test_a_cancel_waits_for_a_payment_still_in_flight_and_reports_it(acme, operator, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 5
    late_payment(1500)
    task = run(invoice_task(acme))
    assert task.state == State.OUTCOME_UNKNOWN
    task = cancel(task, operator)

    # Asked before the payment lands: "not found" is not "absent", so no cancel yet.
    task = run(task)
    action = Action.objects.get(task=task)
    assert (task.state, action.dispatch_state) == (State.CANCEL_REQUESTED, DispatchState.UNKNOWN)
    assert not landed(task)

    wait_until(lambda: landed(task))  # the money moves...
    time.sleep(runner.DEFERRED_HOLD.total_seconds())
    task = run(Task.objects.get(pk=task.pk))
    action = Action.objects.get(task=task)
    assert (task.state, action.dispatch_state) == (State.CANCELED, DispatchState.RECONCILED_SUCCEEDED)
    assert task.outcome["effects_not_undone"] == [
        {
            "action": action.idempotency_key,
            "connector": "payments",
            "external_ref": action.external_ref,
            "step": "pay",
        }
    ]  # ...and the report says so


def test_a_deferred_cancel_is_not_claimed_again_in_a_tight_loop(acme, operator, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 5
    late_payment(1500)
    task = cancel(run(invoice_task(acme)), operator)
    assert runner.run_task(task.id, worker_id="w1", region="default") == "deferred"
    assert runner.run_task(task.id, worker_id="w2", region="default") == "not_claimed"
    wait_until(lambda: landed(task))  # let the late request finish inside this test


def test_an_effect_found_absent_that_lands_after_the_task_ended_amends_its_report(acme, operator, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 0.2  # configured too short for this system: absent is decided early
    late_payment(1500)
    task = cancel(run(invoice_task(acme)), operator)
    time.sleep(0.3)
    task = run(task)
    action = Action.objects.get(task=task)
    assert (task.state, action.dispatch_state) == (State.CANCELED, DispatchState.RECONCILED_ABSENT)
    assert task.outcome["effects_not_undone"] == []
    assert recheck_absent() == 0  # nothing there yet

    wait_until(lambda: landed(task))
    assert recheck_absent() == 1
    task = Task.objects.get(pk=task.pk)
    action = Action.objects.get(task=task)
    effect = Effect.objects.get(idempotency_key=action.idempotency_key)
    assert (task.state, action.dispatch_state) == (State.CANCELED, DispatchState.RECONCILED_SUCCEEDED)
    assert action.external_ref == str(effect.pk)
    found = {
        "action": action.idempotency_key,
        "connector": "payments",
        "external_ref": str(effect.pk),
        "step": "pay",
    }
    assert task.outcome["effects_not_undone"] == [found]
    [late] = task.outcome["late_effects"]
    assert {k: v for k, v in late.items() if k != "found_at"} == found
    event = TransitionEvent.objects.get(task=task, state_version=task.state_version)
    assert (event.trigger, event.from_state, event.to_state, event.actor_id) == (
        "late_effect_found",
        State.CANCELED,
        State.CANCELED,
        "system:reconciler",
    )
    assert verify_task(task) is None
    assert recheck_absent() == 0  # recorded once


def test_resend_backoff_doubles_with_jitter_up_to_its_cap(settings):
    settings.LEDGER_RESEND_BACKOFF = 5
    settings.LEDGER_RESEND_BACKOFF_MAX = 60
    rng = random.Random(7)
    for sends, full in [(1, 5), (2, 10), (3, 20), (4, 40), (5, 60), (9, 60)]:
        delays = [resend_backoff(sends, rng=rng) for _ in range(50)]
        assert all(timedelta(seconds=full / 2) <= d <= timedelta(seconds=full) for d in delays)
        assert len(set(delays)) > 1  # jittered: tasks that failed together do not resend together


def test_resends_of_an_absent_effect_stop_at_the_cap_and_escalate(acme, settings):
    """The payment system fails every send (5xx) while its lookups say 404: not a resend storm."""
    settings.CONNECTOR_MAX_IN_FLIGHT = 0
    settings.LEDGER_MAX_SENDS = 3
    Fault.objects.create(system="payments", operation="dispatch", kind="error", remaining=1000)
    task = invoice_task(acme)
    for _ in range(20):  # far more rounds than sends allowed
        task = run(Task.objects.get(pk=task.pk))
        reconcile_unknown()
        task = Task.objects.get(pk=task.pk)
        if task.state == State.WAITING_RETRY:
            sweep(lambda *_: None, now=task.wait_deadline)
    sends = 1000 - Fault.objects.get().remaining
    task = Task.objects.get(pk=task.pk)
    assert sends == 3
    assert (task.state, task.state_reason) == (State.QUARANTINED, "resend_limit_reached")
    assert (task.escalation_level, task.escalated_to) == (1, "operator")
    backoffs = TransitionEvent.objects.filter(task=task, trigger="resend_backoff").count()
    assert backoffs == 2  # a wait before each resend
