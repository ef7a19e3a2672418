"""Demo case of ``pay_invoice``: a payment whose outcome is unknown, and stays so.

The payment was intended and sent, with no answer; the payments system then
answers every lookup of its key with an error (a standing sandbox fault), so the
reconciler can never settle it and, past the demo's threshold, escalates it.
"""

from __future__ import annotations

from demo.cases.seeding import Case, Seeding, standing_fault, task_facts
from ledger.models import IN_DOUBT, Action, DispatchState
from ledger.services import action_move
from tasks import registry, services
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, advance


def unknown(seeding: Seeding) -> None:
    if task := seeding.start(
        "unknown",
        "pay_invoice",
        "Pay invoice INV-77 (payments did not answer)",
        {"invoice_id": "INV-77", "amount": "77.00", "currency": "EUR"},
    ):
        _lost_answer(seeding, task)
    # Every seeding, so a fault cleared by hand comes back with the next seed.
    for action in Action.objects.filter(task__tenant=seeding.tenant, task__idempotency_key="demo-unknown"):
        if action.dispatch_state in IN_DOUBT:
            standing_fault(action.connector, "lookup", action.idempotency_key)


def _lost_answer(seeding: Seeding, task: Task) -> None:
    """A payment in doubt: intended, sent, no answer. The reconciler will ask the payments system."""
    step = registry.get(task.task_type).step_as("pay", registry.Dispatch)
    progress = services.latest_checkpoint(task).progress
    intent = ActionIntent(step="pay", connector="payments", effect=step.effect(task_facts(task)))
    task = seeding.step(task, progress, actions=[intent], reason="intends payments: charge")
    action = Action.objects.get(task=task)
    action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    action_move(action.pk, DispatchState.DISPATCHING, DispatchState.UNKNOWN, last_error="payments: no answer")
    advance(
        task.id,
        task.state_version,
        State.OUTCOME_UNKNOWN,
        actor=seeding.worker,
        trigger=Trigger.DISPATCH_UNKNOWN,
        progress=progress,
        reason="payments did not answer",
        reason_code="dispatch_unknown",
    )


CASES: tuple[Case, ...] = (unknown,)
