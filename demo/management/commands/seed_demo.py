"""manage.py seed_demo: demo tenants, users and tasks (idempotent; refuses in production).

Tenants ``acme`` and ``globex``; in each, users ``<tenant>-operator``,
``-approver``, ``-approver2``, ``-auditor``, ``-admin`` with password
``$DEMO_PASSWORD`` (default ``demo``); the sandbox order records, policies and
approved runtime configs; and tasks waiting for input, an external event and a
retry, one quarantined and two ready for the workers to drive.
"""

from __future__ import annotations

import os
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from approvals import services as approvals
from demo.sandbox.models import Record
from ledger.models import Action, DispatchState
from ledger.services import action_move
from tasks import checkpoints, decisions, registry, services
from tasks.models import Policy, RuntimeConfig
from tasks.services import task_create
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.models import Role, Tenant
from tenancy.services import grant_role

TENANTS = {"acme": "Acme Corporation", "globex": "Globex Inc."}
USERS = {
    "operator": [Role.OPERATOR],
    "approver": [Role.APPROVER],
    "approver2": [Role.APPROVER],
    "auditor": [Role.AUDITOR],
    "admin": [Role.ADMIN, Role.OPERATOR],
}


def _refund(order: str, amount: str) -> dict:
    return {
        "order_id": order,
        "customer_email": f"customer+{order}@example.com",
        "amount": amount,
        "currency": "USD",
        "reason": "Item arrived damaged",
    }


class Command(BaseCommand):
    help = "Create demo tenants, users and tasks (idempotent). Refuses to run with DEBUG off."

    def handle(self, *args, **options):
        if not settings.DEBUG:
            raise CommandError("seed_demo refuses to run under production settings (DEBUG is off).")
        password = os.environ.get("DEMO_PASSWORD", "demo")
        seed_sandbox()
        seed_policies()
        User = get_user_model()
        for slug, name in TENANTS.items():
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
            for suffix, roles in USERS.items():
                user, created = User.objects.get_or_create(username=f"{slug}-{suffix}")
                if created:
                    user.set_password(password)
                    user.save(update_fields=["password"])
                for role in roles:
                    grant_role(user, tenant, role)
            self._tasks(tenant, User.objects.get(username=f"{slug}-operator"))
        self.stdout.write(
            self.style.SUCCESS(f"Demo ready: users <tenant>-operator etc., password {password!r}")
        )

    def _lost_answer(self, task, worker) -> None:
        """A payment in doubt: intended, sent, no answer. The reconciler will ask the payments system."""
        step = registry.get(task.task_type).step_as("pay", registry.Dispatch)
        progress = services.latest_checkpoint(task).progress
        intent = ActionIntent(step="pay", connector="payments", effect=step.effect(task_facts(task)))
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            actor=worker,
            trigger=Trigger.STEP,
            progress=progress,
            actions=[intent],
            reason="intends payments: charge",
        )
        action = Action.objects.get(task=task)
        action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
        action_move(
            action.pk, DispatchState.DISPATCHING, DispatchState.UNKNOWN, last_error="payments: no answer"
        )
        advance(
            task.id,
            task.state_version,
            State.OUTCOME_UNKNOWN,
            actor=worker,
            trigger=Trigger.DISPATCH_UNKNOWN,
            progress=progress,
            reason="payments did not answer",
            reason_code="dispatch_unknown",
        )

    def _tasks(self, tenant: Tenant, operator) -> None:
        worker = Actor.worker("seed-demo")
        now = timezone.now()

        def start(key: str, task_type: str, objective: str, input: dict):
            task, created = task_create(
                tenant=tenant,
                task_type=task_type,
                objective=objective,
                input=input,
                owner=operator,
                idempotency_key=f"demo-{key}",
                actor=Actor.user(operator, ActorKind.INTEGRATOR),
            )
            return task if created else None

        def read(order: str, **facts) -> checkpoints.Progress:
            """Where a refund stands once the order was read and triaged."""
            evidence = [
                checkpoints.EvidenceRef(system="orders", record_id=order, record_version="1", fetched_at=now)
            ]
            order_facts = {
                "order_status": "delivered",
                "order_total": ORDERS[order]["total"],
                "refund_card": ORDERS[order]["card"],
                "triage": "refund",
            }
            return checkpoints.Progress(step="", facts={**order_facts, **facts}, evidence=evidence)

        def wait(task, state: State, trigger: Trigger, step: str, hours: float, progress, **extra):
            progress = progress.model_copy(
                update={"step": step, "facts": {**task_facts(task), **progress.facts}}
            )
            return advance(
                task.id,
                task.state_version,
                state,
                actor=worker,
                trigger=trigger,
                progress=progress,
                wait_deadline=now + timedelta(hours=hours),
                **extra,
            )

        start(
            "ready",
            "refund_request",
            "Refund order A-100 (eligible: a worker will pick it up)",
            _refund("A-100", "12.50"),
        )
        if task := start(
            "input",
            "refund_request",
            "Refund order A-101: which item was damaged?",
            _refund("A-101", "49.00"),
        ):
            wait(task, State.WAITING_INPUT, Trigger.REQUEST_INPUT, "ask_customer", 48, read("A-101"))
        if task := start(
            "external",
            "refund_request",
            "Refund order A-103: waiting for the return shipment",
            _refund("A-103", "89.90"),
        ):
            wait(
                task,
                State.WAITING_EXTERNAL,
                Trigger.AWAIT_EXTERNAL,
                "await_return",
                72,
                read("A-103", damaged_item="teapot lid"),
            )
        if task := start(
            "retry",
            "order_lookup",
            "Look up order A-104 (order system was unavailable)",
            {"order_id": "A-104"},
        ):
            wait(
                task,
                State.WAITING_RETRY,
                Trigger.ATTEMPT_FAILED,
                "lookup",
                0.01,
                checkpoints.Progress(step=""),
                attempt=1,
            )
        if task := start(
            "quarantined",
            "refund_request",
            "Refund order A-106 (held for review)",
            _refund("A-106", "2500.00"),
        ):
            advance(
                task.id,
                task.state_version,
                State.QUARANTINED,
                actor=Actor.user(operator, ActorKind.OPERATOR),
                trigger=Trigger.QUARANTINE,
                reason="Amount far above the customer's history",
                reason_code="quarantine",
            )
        start("lookup", "order_lookup", "Look up order A-107", {"order_id": "A-107"})
        if task := start(
            "approval",
            "refund_request",
            "Refund order A-102: approve the payment",
            _refund("A-102", "420.00"),
        ):
            progress = read("A-102", damaged_item="vase", return_tracking="TRK-A102")
            progress = progress.model_copy(
                update={"step": "approve", "facts": {**task_facts(task), **progress.facts}}
            )
            task = advance(
                task.id,
                task.state_version,
                State.READY,
                actor=worker,
                trigger=Trigger.STEP,
                progress=progress,
            )
            kind = registry.get(task.task_type)
            approve = kind.step_as("approve", registry.RequestApproval)
            ask = approvals.request_decision(task, kind, approve, progress, now=now)
            decisions.commit(task, ask, actor=worker)
        if task := start(
            "unknown",
            "pay_invoice",
            "Pay invoice INV-77 (payments did not answer)",
            {"invoice_id": "INV-77", "amount": "77.00", "currency": "EUR"},
        ):
            self._lost_answer(task, worker)


ORDERS = {
    "A-100": {"status": "delivered", "total": "12.50", "card": "visa-4242"},
    "A-101": {"status": "delivered", "total": "49.00", "card": "visa-1881"},
    "A-102": {"status": "delivered", "total": "420.00", "card": "amex-0005"},
    "A-103": {"status": "delivered", "total": "89.90", "card": "mastercard-4444"},
    "A-104": {"status": "shipped", "total": "15.00", "card": "visa-4242"},
    "A-106": {"status": "delivered", "total": "150.00", "card": "visa-0077"},
    "A-107": {"status": "delivered", "total": "32.00", "card": "visa-4242"},
}


def task_facts(task) -> dict:
    return registry.get(task.task_type).initial_facts(task.input)


def seed_sandbox() -> None:
    """The order system's records the demo tasks read as evidence (version 1 each)."""
    for order, data in ORDERS.items():
        Record.objects.get_or_create(system="orders", record_id=order, defaults={"data": data})


def seed_policies() -> None:
    for name in registry.names():
        kind = registry.get(name)
        Policy.objects.get_or_create(task_type=name, defaults={"version": settings.DEFAULT_POLICY_VERSION})
        RuntimeConfig.objects.get_or_create(
            task_type=name,
            model_id=kind.model_id,
            prompt_id=kind.prompt_id,
            toolset_id=kind.toolset_id,
            defaults={"approved": True, "current": True},
        )
