"""The reconciler (``runtime.reconcile``): settling effects in doubt by asking the system that holds them.

Against the sandbox over real HTTP. A lookup that finds nothing is only
trusted after ``CONNECTOR_MAX_IN_FLIGHT`` since the send was claimed; an
absent effect is resent with backoff and only so many times; an effect that
lands after its task ended amends the report. The payments system here
commits late on purpose (``latency`` faults sleep before committing), as real
ones do after the client has given up. Every test counts the effects the
authoritative system holds: the ledger may be unsure, but an effect must never
be doubled.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from runtime import runner
from runtime.reconcile import recheck_absent, reconcile_unknown, resend_backoff
from runtime.sweep import sweep
from tasks.models import Task
from tasks.states import State
from tests.conftest import api_client_for
from tests.runtime.payments import (
    cancel,
    fault,
    invoice_task,
    landed,
    late_payment,
    payments,
    run,
    wait_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.LEDGER_RESEND_BACKOFF = 0.05
    settings.LATE_EFFECT_RECHECK_EVERY = 0


def unknown_payment(tenant) -> tuple[Task, Action]:
    """A payment the system refused to perform (503) but the ledger cannot know that: in doubt."""
    fault("error")
    task = run(invoice_task(tenant))
    action = Action.objects.get(task=task)
    assert (task.state, action.dispatch_state, payments()) == (
        State.OUTCOME_UNKNOWN,
        DispatchState.UNKNOWN,
        0,
    )
    return task, action


@pytest.mark.parametrize("kind", ["timeout", "ambiguous"])
def test_a_lost_answer_makes_the_outcome_unknown_and_the_reconciler_finds_it_done(acme, kind):
    fault(kind, seconds=1)
    task = run(invoice_task(acme))
    action = Action.objects.get(task=task)
    assert (task.state, action.dispatch_state) == (State.OUTCOME_UNKNOWN, DispatchState.UNKNOWN)
    assert payments() == 1  # it did happen; the ledger just cannot know yet

    assert run(task).state == State.OUTCOME_UNKNOWN  # no worker touches it: nothing is re-sent blindly
    assert reconcile_unknown() == 1
    action.refresh_from_db()
    assert action.dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    assert action.unknown_since is not None and action.resolved_at >= action.unknown_since

    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED and payments() == 1
    assert Action.objects.get(task=task).attempts == 1


def test_an_effect_found_absent_is_sent_again_with_the_same_key_and_happens_once(acme, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 0.3
    fault("error")
    task = run(invoice_task(acme))
    first = Action.objects.get(task=task)
    assert (task.state, first.dispatch_state, payments()) == (State.OUTCOME_UNKNOWN, DispatchState.UNKNOWN, 0)

    time.sleep(0.4)  # past the time the send could still land
    reconcile_unknown()
    task = Task.objects.get(pk=task.pk)
    assert Action.objects.get(task=task).dispatch_state == DispatchState.RECONCILED_ABSENT
    assert (task.state, task.state_reason) == (State.WAITING_RETRY, "effect_absent")  # resent after a backoff

    sweep(lambda *_: None, now=task.wait_deadline)
    task = run(Task.objects.get(pk=task.pk))
    action = Action.objects.get(task=task)
    assert task.state == State.COMPLETED
    assert (action.idempotency_key, action.attempts, payments()) == (first.idempotency_key, 2, 1)


def test_not_found_before_the_send_could_land_is_not_trusted_as_absent(acme, settings):
    """The first request is still on its way when the caller gives up, and lands after the first lookup."""
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.CONNECTOR_MAX_IN_FLIGHT = 5
    fault("latency", ms=1000)
    task = run(invoice_task(acme))
    assert task.state == State.OUTCOME_UNKNOWN
    reconcile_unknown()
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.UNKNOWN  # not found, but it may still land
    assert action.last_error.startswith("not found yet; trusted as absent from")
    assert Task.objects.get(pk=task.pk).state == State.OUTCOME_UNKNOWN

    time.sleep(1.5)  # ...and lands now
    reconcile_unknown()
    assert Action.objects.get(task=task).dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    task = run(Task.objects.get(pk=task.pk))
    action = Action.objects.get(task=task)
    assert task.state == State.COMPLETED
    assert (payments(), action.attempts, Effect.objects.get().deliveries) == (1, 1, 1)  # never sent twice


def test_a_reconciler_that_cannot_reach_the_system_keeps_waiting_and_escalates(acme, settings):
    fault("timeout", seconds=1)
    task = run(invoice_task(acme))
    Fault.objects.create(system="payments", operation="lookup", kind="error", remaining=5)
    settings.UNKNOWN_OUTCOME_ESCALATE_AFTER = 0
    assert reconcile_unknown() == 0
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.OUTCOME_UNKNOWN
    assert (task.escalation_level, task.escalated_to) == (1, "operator")
    assert Action.objects.get(task=task).dispatch_state == DispatchState.UNKNOWN


def test_a_cancel_waiting_on_a_system_that_cannot_answer_is_escalated_too(acme, operator, settings):
    fault("timeout", seconds=1)
    task = cancel(run(invoice_task(acme)), operator)
    Fault.objects.create(system="payments", operation="lookup", kind="error", remaining=5)
    assert runner.run_task(task.id, worker_id="w", region="default") == "deferred"
    settings.UNKNOWN_OUTCOME_ESCALATE_AFTER = 0
    reconcile_unknown()
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.CANCEL_REQUESTED  # still waiting for the system, and now a person knows
    assert (task.escalation_level, task.escalated_to) == (1, "operator")

    Fault.objects.filter(operation="lookup").delete()  # the system answers again
    time.sleep(runner.DEFERRED_HOLD.total_seconds())
    task = run(task)
    assert (task.state, task.outcome["canceled"]) == (State.CANCELED, "cancel:task")  # the scope asked for


def test_an_operator_reconciles_on_demand_over_the_api(acme, operator):
    fault("ambiguous")
    task = run(invoice_task(acme))
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/reconcile/",
        {"expected_version": task.state_version, "reason": "payments confirmed by phone"},
        format="json",
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] is True and "reconciled_succeeded" in body["note"]
    assert body["task"]["state"] == State.READY


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


def test_an_effect_the_system_recorded_as_failed_is_settled_failed_and_never_sent_again(acme):
    task, action = unknown_payment(acme)
    # The payments system's own record says the charge failed.
    Effect.objects.create(system="payments", idempotency_key=action.idempotency_key, status="failed")
    assert reconcile_unknown() == 1
    action.refresh_from_db()
    assert (action.dispatch_state, action.outcome["status"]) == (DispatchState.RECONCILED_FAILED, "failed")
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.READY, "reconciled")

    task = run(task)
    assert (task.state, task.state_reason) == (State.FAILED, "effect_rejected")
    assert Action.objects.get(pk=action.pk).attempts == 1


def test_the_system_is_asked_about_an_action_at_most_once_per_lookup_interval(acme, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 60
    task, action = unknown_payment(acme)
    settings.LEDGER_LOOKUP_INTERVAL = 60
    # Every lookup the payments system receives uses up one of these.
    lookups = Fault.objects.create(system="payments", operation="lookup", kind="error", remaining=100)
    for _ in range(3):
        reconcile_unknown()
    lookups.refresh_from_db()
    assert lookups.remaining == 99

    Action.objects.filter(pk=action.pk).update(checked_at=timezone.now() - timedelta(seconds=61))
    reconcile_unknown()
    lookups.refresh_from_db()
    assert lookups.remaining == 98
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.UNKNOWN


def test_an_absent_effect_waits_between_half_and_all_of_its_backoff_before_it_is_sent_again(acme, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 0
    settings.LEDGER_RESEND_BACKOFF = 30
    task, action = unknown_payment(acme)
    before = timezone.now()
    reconcile_unknown()
    after = timezone.now()
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.WAITING_RETRY, "effect_absent")
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.RECONCILED_ABSENT
    assert before + timedelta(seconds=15) <= task.wait_deadline <= after + timedelta(seconds=30)

    sweep(lambda *_: None, now=task.wait_deadline - timedelta(seconds=1))
    assert Task.objects.get(pk=task.pk).state == State.WAITING_RETRY
    assert payments() == 0


def test_an_unknown_outcome_is_escalated_once_it_is_overdue_and_only_once(acme, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 60
    settings.UNKNOWN_OUTCOME_ESCALATE_AFTER = 600
    task, action = unknown_payment(acme)
    reconcile_unknown()
    assert Task.objects.get(pk=task.pk).escalation_level == 0

    Action.objects.filter(pk=action.pk).update(unknown_since=timezone.now() - timedelta(seconds=601))
    reconcile_unknown()
    reconcile_unknown()
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.OUTCOME_UNKNOWN, "unknown_outcome_overdue")
    assert (task.escalation_level, task.escalated_to) == (1, "operator")
    assert TransitionEvent.objects.filter(task=task, trigger="escalate").count() == 1
