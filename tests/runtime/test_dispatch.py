"""The action ledger against the sandbox over real HTTP: faults, reconciliation, compensation.

Every test counts the effects the authoritative system holds: the ledger may
be unsure, but an effect must never be doubled.
"""

from __future__ import annotations

import time

import pytest

from audit.models import TransitionEvent
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from runtime import controls, runner
from runtime.reconcile import reconcile_unknown
from runtime.sweep import sweep
from tasks import services
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)
INVOICE = {"invoice_id": "INV-1", "amount": "25.00", "currency": "EUR"}


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.5
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.LEDGER_RESEND_BACKOFF = 0.05


def invoice_task(tenant, **input_overrides) -> Task:
    return make_task(
        tenant, task_type="pay_invoice", objective="Pay INV-1", input={**INVOICE, **input_overrides}
    )


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def fault(kind: str, **params) -> None:
    Fault.objects.create(system="payments", operation="dispatch", kind=kind, params=params)


def payments() -> int:
    return Effect.objects.filter(system="payments").count()


def test_a_payment_is_dispatched_once_and_recorded(acme):
    task = run(invoice_task(acme))
    action = Action.objects.get(task=task)
    assert task.state == State.COMPLETED
    assert action.dispatch_state == DispatchState.SUCCEEDED and action.attempts == 1
    assert task.outcome["payment_ref"] == action.external_ref == str(Effect.objects.get().pk)
    assert Effect.objects.get().idempotency_key == action.idempotency_key
    # intent committed before the send (checkpoint before dispatch), outcome recorded after
    assert [e.trigger for e in TransitionEvent.objects.filter(task=task).order_by("state_version")] == [
        "start",
        "step",
        "step",
        "complete",
    ]


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


def test_an_operator_reconciles_on_demand_over_the_api(acme, operator):
    from tests.conftest import api_client_for

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


def test_a_rejected_refund_is_compensated_by_a_new_action_of_its_own(acme, approver):
    put_order("A-1")
    task = run(make_task(acme))
    services.task_provide_input(
        task, expected_version=task.state_version, answer="mug", actor=Actor(ActorKind.INTEGRATOR, "t")
    )
    task = run(Task.objects.get(pk=task.pk))
    fault("reject")
    services.task_deliver_event(
        task,
        event_key="ship-1",
        event_type="shipment.returned",
        payload={"tracking_number": "T-1"},
        actor=Actor(ActorKind.INTEGRATOR, "t"),
    )
    task = run(Task.objects.get(pk=task.pk))
    approve(task, approver)
    task = run(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.FAILED, "refund_rejected_by_payments")
    ticket, refund, close = Action.objects.filter(task=task).order_by("id")
    assert (ticket.step, refund.step, close.step) == ("open_ticket", "pay_refund", "close_ticket")
    assert refund.dispatch_state == DispatchState.FAILED
    assert close.compensation_of_id == ticket.pk and close.dispatch_state == DispatchState.SUCCEEDED
    assert close.idempotency_key not in (ticket.idempotency_key, refund.idempotency_key)
    assert close.effect == {
        "kind": "ticket.close",
        "ticket": ticket.external_ref,
        "reason": "refund declined",
    }
    assert [e.system for e in Effect.objects.order_by("id")] == ["tickets", "tickets"]
    intents = TransitionEvent.objects.filter(task=task, reason__startswith="intends tickets")
    assert intents.count() == 2  # the compensation's intent was its own audited transition


def test_cancel_during_an_unsettled_dispatch_reconciles_and_reports_the_effect(acme, operator):
    fault("timeout", seconds=1)
    task = run(invoice_task(acme))
    assert task.state == State.OUTCOME_UNKNOWN
    controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="customer withdrew",
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.CANCELED
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    assert task.outcome["effects_not_undone"] == [
        {
            "action": action.idempotency_key,
            "connector": "payments",
            "external_ref": action.external_ref,
            "step": "pay",
        },
    ]
    assert payments() == 1


def test_nothing_is_resent_while_the_outcome_is_unknown(acme):
    fault("timeout", seconds=1)
    task = run(invoice_task(acme))
    for _ in range(3):
        run(Task.objects.get(pk=task.pk))
    assert payments() == 1 and Action.objects.get(task=task).attempts == 1
