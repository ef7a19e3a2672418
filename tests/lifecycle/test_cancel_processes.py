"""Cancel a task while a real worker process is inside a model turn, a tool call, or waiting on children.

Each must end ``canceled`` with a report that says what happened, start no new
work after the request, and settle every effect in flight with the system that
performed it. The model takes seconds per turn (``MODEL_LATENCY_MS``); the
worker beats every third of a second (lease TTL 1 s), so a cancel reaches a
turn in flight well before the turn would have answered.
"""

from __future__ import annotations

import time

import pytest

from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from runtime import controls
from tasks import services
from tasks.models import CancelRequest, Task
from tasks.states import State, Trigger
from tests.conftest import make_task
from tests.workflow import put_order, state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
SLOW_MODEL = {"MODEL_LATENCY_MS": "6000"}
# A payment's answer is awaited 1 s; "absent" is trusted only 4 s after the send.
IN_DOUBT = {"CONNECTOR_TIMEOUT": "1", "CONNECTOR_MAX_IN_FLIGHT": "4", "LEDGER_LOOKUP_INTERVAL": "0"}


def cancel(task: Task, operator) -> float:
    """Cancel (scope task) as the operator would; return when, on the monotonic clock."""
    task = Task.objects.get(pk=task.pk)
    controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="the customer withdrew",
    )
    return time.monotonic()


def events_after_cancel(task: Task) -> list[str]:
    asked = TransitionEvent.objects.filter(task=task, trigger=Trigger.CANCEL).get()
    return list(
        TransitionEvent.objects.filter(task=task, state_version__gt=asked.state_version)
        .order_by("state_version")
        .values_list("trigger", flat=True)
    )


def in_model_turn(task: Task, step: str) -> bool:
    """The task's newest checkpoint stands at ``step`` (a model turn) and a worker holds it."""
    current = Task.objects.get(pk=task.pk)
    return (
        current.state == State.READY
        and services.latest_checkpoint(current).step == step
        and hasattr(current, "lease")
        and current.lease.expires_at > current.updated_at
    )


def test_cancel_during_a_model_turn_stops_the_turn_and_ends_canceled(acme, operator, workers):
    put_order("A-1")
    task = make_task(acme, task_type="order_lookup", objective="Look A-1 up", input={"order_id": "A-1"})
    workers(extra_env=SLOW_MODEL)
    wait_for(lambda: in_model_turn(task, "summarize"), what="the worker inside the model turn")
    asked_at = cancel(task, operator)

    wait_for(lambda: state_of(task)[0] == State.CANCELED, timeout=20, what="the cancel")
    # Well before the 6 s turn would have answered: the turn was interrupted, not waited out.
    assert time.monotonic() - asked_at < 5
    task = Task.objects.get(pk=task.pk)
    assert task.outcome["canceled"] == "cancel:task"
    assert task.outcome["requested_by"] == f"user:{operator.username}"
    assert task.outcome["effects_not_undone"] == [] and task.outcome["children"] == []
    assert events_after_cancel(task) == [Trigger.CANCEL_CONFIRMED]  # the turn's answer was never committed
    assert "summary" not in services.latest_checkpoint(task).facts
    assert CancelRequest.objects.get(task=task).status == CancelRequest.Status.APPLIED
    assert verify_task(task) is None


def test_cancel_during_a_tool_call_in_flight_reconciles_it_and_reports_it_not_undone(acme, operator, workers):
    # The payment lands 2.5 s after it is sent; the worker gives up waiting after 1 s: in doubt.
    Fault.objects.create(system="payments", operation="dispatch", kind="latency", params={"ms": 2500})
    task = make_task(
        acme,
        task_type="pay_invoice",
        objective="Pay INV-9",
        input={"invoice_id": "INV-9", "amount": "25.00", "currency": "EUR"},
    )
    workers(
        extra_env={"CONNECTOR_TIMEOUT": "1", "CONNECTOR_MAX_IN_FLIGHT": "4", "LEDGER_LOOKUP_INTERVAL": "0"}
    )
    wait_for(
        lambda: Action.objects.filter(task=task, dispatch_state=DispatchState.DISPATCHING).exists(),
        what="the payment in flight",
    )
    cancel(task, operator)

    wait_for(lambda: state_of(task)[0] == State.CANCELED, timeout=40, what="the cancel")
    task = Task.objects.get(pk=task.pk)
    action = Action.objects.get(task=task)
    [payment] = Effect.objects.filter(system="payments")  # sent once, never again after the request
    assert action.dispatch_state == DispatchState.RECONCILED_SUCCEEDED  # settled by asking the system
    assert task.outcome["effects_not_undone"] == [
        {
            "action": action.idempotency_key,
            "connector": "payments",
            "external_ref": str(payment.pk),
            "step": "pay",
            "compensation": "",
        }
    ]
    assert task.outcome["withdrawn_unsent"] == []
    assert set(events_after_cancel(task)) <= {Trigger.CANCEL_CONFIRMED, Trigger.DISPATCH_UNKNOWN}
    assert events_after_cancel(task)[-1] == Trigger.CANCEL_CONFIRMED
    assert verify_task(task) is None


def test_cancel_with_children_running_cancels_them_first_and_reports_them(acme, operator, workers):
    for order_id in ("B-1", "B-2", "B-3"):
        put_order(order_id)
    parent = make_task(
        acme, task_type="order_batch", objective="Batch", input={"order_ids": ["B-1", "B-2", "B-3"]}
    )
    workers(extra_env=SLOW_MODEL, args=("--concurrency", "8"))
    children = lambda: list(Task.objects.filter(parent=parent).order_by("idempotency_key"))  # noqa: E731
    wait_for(
        lambda: len(children()) == 3 and all(in_model_turn(child, "summarize") for child in children()),
        what="every child inside its model turn",
    )
    asked_at = cancel(parent, operator)

    wait_for(lambda: state_of(parent)[0] == State.CANCELED, timeout=30, what="the parent's cancel")
    assert time.monotonic() - asked_at < 5  # the children's turns were interrupted, not waited out
    parent = Task.objects.get(pk=parent.pk)
    assert parent.outcome["children"] == [{"task": str(c.id), "state": "canceled"} for c in children()]
    for child in children():
        assert child.outcome["canceled"] == "cancel:task"
        assert events_after_cancel(child) == [Trigger.CANCEL_CONFIRMED]  # no new work after the request
        assert verify_task(child) is None
    # The parent confirmed only after its last child had ended.
    confirmed = TransitionEvent.objects.get(task=parent, trigger=Trigger.CANCEL_CONFIRMED).created_at
    assert all(
        TransitionEvent.objects.get(task=c, trigger=Trigger.CANCEL_CONFIRMED).created_at <= confirmed
        for c in children()
    )
    assert verify_task(parent) is None
