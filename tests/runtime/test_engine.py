"""The agent step (``runtime.engine.decide``): what a worker decides from a task and its checkpoint.

Driven through the in-process resume loop against the sandbox over real HTTP;
the model is the deterministic scripted one. Steps that read evidence, wait,
dispatch and compensate; cancels that settle effects in flight first; a
checkpoint from another deployment or naming a step the code no longer has.
"""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime import controls, engine, runner
from tasks import services
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.foreign_checkpoints import written_as
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
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1")


def waiting_for_input(tenant, **overrides) -> Task:
    task = run(make_task(tenant, **overrides))
    assert task.state == State.WAITING_INPUT
    return task


def answer(task: Task, text: str = "mug") -> Task:
    services.task_provide_input(task, expected_version=task.state_version, answer=text, actor=INTEGRATOR)
    return Task.objects.get(pk=task.pk)


def test_a_refund_runs_to_waiting_input_with_its_evidence_recorded(acme):
    task = waiting_for_input(acme)
    point = services.latest_checkpoint(task)
    assert point.step == "ask_customer"
    assert point.facts["order_status"] == "delivered" and point.facts["triage"] == "refund"
    assert point.facts["triage_model"] == "scripted-v1"
    assert task.wait_deadline is not None and task.wait_deadline > timezone.now()


def test_a_checkpoint_naming_a_step_the_code_no_longer_has_quarantines(acme):
    # Written by a deployment whose workflow still had that step.
    with written_as(body=lambda row: row.body.replace('"gather_evidence"', '"renamed_step"')):
        task = make_task(acme)
    task = run(task)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "unknown_step")


def test_a_ready_task_from_another_deployment_is_revalidated_before_it_resumes(acme, settings):
    task = make_task(acme)
    settings.DEPLOYMENT_ID = "2026-12-01"
    task = run(task)
    assert task.state == State.WAITING_INPUT
    triggers = list(
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("trigger", flat=True)
    )
    assert triggers[:3] == ["start", "deployment_changed", "proceed"]
    assert services.latest_checkpoint(task).deployment == "2026-12-01"


def test_an_event_delivered_while_the_worker_decides_to_wait_is_not_lost(acme, monkeypatch):
    task = answer(waiting_for_input(acme))
    real_decide = engine.decide

    def decide_then_event_arrives(task, checkpoint, **kwargs):
        decision = real_decide(task, checkpoint, **kwargs)
        if decision and decision.to_state == State.WAITING_EXTERNAL:
            services.task_deliver_event(
                Task.objects.get(pk=task.pk),
                event_key="ship-race",
                event_type="shipment.returned",
                payload={"tracking_number": "RACE"},
                actor=INTEGRATOR,
            )
        return decision

    monkeypatch.setattr(engine, "decide", decide_then_event_arrives)
    assert runner.run_task(task.id, worker_id="w", region="default") == "stale_version"
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.READY  # the wait was never entered
    monkeypatch.setattr(engine, "decide", real_decide)
    task = run(task)
    assert task.state == State.WAITING_APPROVAL
    assert services.latest_checkpoint(task).facts["return_tracking"] == "RACE"


def test_a_rejected_refund_is_compensated_by_a_new_action_of_its_own(acme, approver):
    task = run(make_task(acme))
    services.task_provide_input(task, expected_version=task.state_version, answer="mug", actor=INTEGRATOR)
    task = run(Task.objects.get(pk=task.pk))
    fault("reject")
    services.task_deliver_event(
        task,
        event_key="ship-1",
        event_type="shipment.returned",
        payload={"tracking_number": "T-1"},
        actor=INTEGRATOR,
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
            "compensation": "",  # pay_invoice has no step that undoes a payment
        },
    ]
    assert payments() == 1


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
            "compensation": "",
        }
    ]  # ...and the report says so
