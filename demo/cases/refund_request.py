"""Demo cases of ``refund_request``: one for the workers to run, one per wait, an operator's hold,
checkpoints the running code cannot read (or that were tampered with), a step that raised, approvals
pending (one asked again after its order changed), a rejected refund to rerun, a cancel whose ticket
stays open, and a long history."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from approvals import services as approvals
from demo.cases.seeding import ORDERS, WORKER_ID, Case, Seeding
from demo.foreign import written_as
from demo.sandbox.models import Effect, Record
from ledger.models import Action, DispatchState
from ledger.services import action_move
from runtime import controls, runner
from tasks import checkpoints, leases, registry, services
from tasks.models import Checkpoint, Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.models import Role

LONG_HISTORY = 400  # steps of the long-history case
CHANGED_CARD = "visa-5556"  # the card order A-108 changes to, so its payment is asked about again


def _refund(order: str, amount: str | None = None) -> dict[str, Any]:
    """A refund of ``order`` (of its whole total unless ``amount`` says otherwise)."""
    return {
        "order_id": order,
        "customer_email": f"customer+{order}@example.com",
        "amount": amount or ORDERS[order]["total"],
        "currency": "USD",
        "reason": "Item arrived damaged",
    }


def _start(seeding: Seeding, key: str, order: str, objective: str, amount: str | None = None) -> Task | None:
    return seeding.start(key, "refund_request", objective, _refund(order, amount))


def _ask_customer(seeding: Seeding, task: Task, order: str) -> Task:
    progress = seeding.read(task, order, step="ask_customer")
    return seeding.wait(task, State.WAITING_INPUT, Trigger.REQUEST_INPUT, progress, hours=48)


# --- for the workers, and one per wait ------------------------------------------------------------


def ready(seeding: Seeding) -> None:
    _start(seeding, "ready", "A-100", "Refund order A-100 (eligible: a worker will pick it up)")


def waiting_input(seeding: Seeding) -> None:
    if task := _start(seeding, "input", "A-101", "Refund order A-101: which item was damaged?"):
        _ask_customer(seeding, task, "A-101")


def waiting_external(seeding: Seeding) -> None:
    objective = "Refund order A-103: waiting for the return shipment"
    if task := _start(seeding, "external", "A-103", objective):
        progress = seeding.read(task, "A-103", step="await_return", damaged_item="teapot lid")
        seeding.wait(task, State.WAITING_EXTERNAL, Trigger.AWAIT_EXTERNAL, progress, hours=72)


def held(seeding: Seeding) -> None:
    """Quarantined by an operator (a refund far above the order's total): only a release lets it go on."""
    if task := _start(seeding, "quarantined", "A-106", "Refund order A-106 (held for review)", "2500.00"):
        advance(
            task.id,
            task.state_version,
            State.QUARANTINED,
            actor=Actor.user(seeding.operator, ActorKind.OPERATOR),
            trigger=Trigger.QUARANTINE,
            reason="Amount far above the customer's history",
            reason_code="quarantine",
        )


def approval(seeding: Seeding) -> None:
    if task := _start(seeding, "approval", "A-102", "Refund order A-102: approve the payment"):
        progress = seeding.read(
            task, "A-102", step="approve", damaged_item="vase", return_tracking="TRK-A102"
        )
        seeding.ask_approval(task, progress)


def ticket_left_open(seeding: Seeding) -> None:
    """The ticket is opened (its effect is in the sandbox), then an operator cancels the refund.
    The running demo's worker confirms the cancel: its report lists the ticket as not undone,
    and the task page offers close_ticket to undo it (a compensation run)."""
    objective = "Refund order A-117 (canceled after its ticket was opened)"
    task = _start(seeding, "canceled", "A-117", objective)
    if task is None:
        return
    progress = seeding.read(task, "A-117", step="open_ticket", damaged_item="mug", return_tracking="TRK-A117")
    effect = registry.get(task.task_type).step_as("open_ticket", registry.Dispatch).effect(progress.facts)
    intent = ActionIntent(step="open_ticket", connector="tickets", effect=effect)
    task = seeding.step(task, progress, actions=[intent], reason="intends tickets: ticket.open")
    action = Action.objects.get(task=task)
    opened, _ = Effect.objects.get_or_create(
        system="tickets", idempotency_key=action.idempotency_key, defaults={"request": effect}
    )
    action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    action_move(action.pk, DispatchState.DISPATCHING, DispatchState.SUCCEEDED, external_ref=str(opened.pk))
    controls.task_control(
        task,
        "cancel",
        user=seeding.operator,
        roles=frozenset({Role.OPERATOR}),
        expected_version=task.state_version,
        reason="the customer withdrew the claim",
    )


# --- quarantined: checkpoints the running code cannot read, and a step that raised ---------------


def _unreadable(key: str, order: str, why: str, written: Mapping[str, Any]) -> Case:
    """A case whose checkpoint is written by other code (``written_as``) through a real transition,
    then found unreadable the way a worker finds it."""

    def case(seeding: Seeding) -> None:
        if task := _start(seeding, key, order, f"Refund order {order} ({why})"):
            with written_as(**written):
                task = _ask_customer(seeding, task, order)
            services.task_resume_point(task.id, actor=seeding.worker)

    case.__name__ = key.replace("-", "_")
    return case


_NEWER = checkpoints.CURRENT_SCHEMA + 1
# Left untouched by this deployment's workers, for the newer one's (a mixed-version rollout).
newer_checkpoint = _unreadable(
    "q-newer",
    "A-110",
    "written by a newer deployment",
    {
        "body": json.dumps({"schema_version": _NEWER, "step": "ask_customer", "deployment": "next"}),
        "schema_version": _NEWER,
    },
)
corrupt_checkpoint = _unreadable(
    "q-corrupt", "A-111", "its checkpoint does not decode", {"body": '{"schema_version": 2, "step": '}
)
unmigratable_checkpoint = _unreadable(
    "q-unmigratable",
    "A-112",
    "an old checkpoint no migration reads",
    {"body": '{"schema_version": 0, "position": "ask_customer"}', "schema_version": 0},
)


def tampered_checkpoint(seeding: Seeding) -> None:
    if task := _start(
        seeding, "q-tampered", "A-115", "Refund order A-115 (its checkpoint was edited behind our back)"
    ):
        task = _ask_customer(seeding, task, "A-115")
        row = Checkpoint.objects.get(task=task, state_version=task.state_version)
        body = json.loads(row.body)
        body["facts"]["amount"] = "9999.00"
        Checkpoint.objects.filter(pk=row.pk).update(body=json.dumps(body))  # tampering, by SQL
        services.task_resume_point(task.id, actor=seeding.worker)


def step_error(seeding: Seeding) -> None:
    """The worker's own path: a claimed lease, then what the runner does when a step raises."""
    if task := _start(seeding, "q-step-error", "A-116", "Refund order A-116 (a step raised)"):
        lease = leases.claim(task.id, worker_id=WORKER_ID, region=task.region)
        if lease is not None:
            try:
                runner._quarantine_after_error(task.id, seeding.worker, lease, KeyError("refund_card"))
            finally:
                leases.release(lease)


# --- decided: rejected (to rerun), and approved then asked again -----------------------------------


def rejected(seeding: Seeding) -> None:
    """Failed because an approver said no: the operator may rerun it."""
    if task := _start(seeding, "failed", "A-105", "Refund order A-105 (rejected by the approver)"):
        task, request = seeding.ask_approval(task, seeding.read(task, "A-105", step="approve"))
        approvals.approval_decide(
            request,
            user=seeding.approver,
            decision="reject",
            digest_seen=request.digest,
            comment="Refunded in store.",
        )
        task = Task.objects.get(pk=task.pk)
        progress = services.latest_checkpoint(task).progress
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            actor=seeding.worker,
            trigger=Trigger.PROCEED,
            progress=progress,
            reason_code="revalidated",
        )
        advance(
            task.id,
            task.state_version,
            State.FAILED,
            actor=seeding.worker,
            trigger=Trigger.FAIL,
            progress=progress.model_copy(update={"step": "approval_rejected"}),
            reason_code="refund_rejected_by_approver",
            outcome={"reason": "refund_rejected_by_approver"},
        )


def reapproval(seeding: Seeding) -> None:
    """Approved, then the order record changed (v1 -> v2, a new card): the task refreshed its
    evidence and asks again for the changed payment."""
    if task := _start(
        seeding, "reapproval", "A-108", "Refund order A-108: approve again (the order changed)"
    ):
        task, first = seeding.ask_approval(task, seeding.read(task, "A-108", step="approve"))
        approvals.approval_decide(first, user=seeding.approver, decision="approve", digest_seen=first.digest)
        record = Record.objects.get(system="orders", record_id="A-108")
        if record.version == 1:
            Record.objects.filter(pk=record.pk).update(data={**record.data, "card": CHANGED_CARD}, version=2)
        task = Task.objects.get(pk=task.pk)
        kind = registry.get(task.task_type)
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            actor=seeding.worker,
            trigger=Trigger.REFRESH,
            progress=services.latest_checkpoint(task).progress.model_copy(update={"step": kind.replan_step}),
            reason="evidence changed: orders/A-108 v1 -> v2",
            reason_code="evidence_changed",
        )
        again = seeding.read(task, "A-108", step="approve", version="2", refund_card=CHANGED_CARD)
        seeding.ask_approval(
            task,
            again,
            reason="read orders/A-108 v2",
            why="re-approval: the action changed since it was approved",
        )


def long_history(seeding: Seeding) -> None:
    """A refund the model and the customer went back and forth on."""
    if task := _start(
        seeding, "long-history", "A-109", f"Refund order A-109 ({LONG_HISTORY} steps of history)"
    ):
        for turn in range(1, LONG_HISTORY + 1):
            progress = seeding.read(task, "A-109", step="triage", turn=turn)
            task = seeding.step(task, progress, reason=f"turn {turn}: the customer's answer is still unclear")
        progress = seeding.read(task, "A-109", step="await_return", damaged_item="jug")
        seeding.wait(task, State.WAITING_EXTERNAL, Trigger.AWAIT_EXTERNAL, progress, hours=30 * 24)


CASES: tuple[Case, ...] = (
    ready,
    waiting_input,
    waiting_external,
    held,
    approval,
    ticket_left_open,
    newer_checkpoint,
    corrupt_checkpoint,
    unmigratable_checkpoint,
    tampered_checkpoint,
    step_error,
    rejected,
    reapproval,
    long_history,
)
