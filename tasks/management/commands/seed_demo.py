"""manage.py seed_demo: demo tenants, users and tasks (idempotent; refuses in production).

Tenants ``acme`` and ``globex``; in each, users ``<tenant>-operator``,
``-approver``, ``-approver2``, ``-auditor``, ``-admin`` with password
``$DEMO_PASSWORD`` (default ``demo``), and tasks in every waiting state,
``outcome_unknown``, ``quarantined``, ``ready`` and ``completed``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tasks import checkpoints
from tasks.services import task_create
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.models import Membership, Role, Tenant

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
        User = get_user_model()
        for slug, name in TENANTS.items():
            tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": name})
            for suffix, roles in USERS.items():
                user, created = User.objects.get_or_create(username=f"{slug}-{suffix}")
                if created:
                    user.set_password(password)
                    user.save(update_fields=["password"])
                for role in roles:
                    Membership.objects.get_or_create(user=user, tenant=tenant, role=role)
            self._tasks(tenant, User.objects.get(username=f"{slug}-operator"))
        self.stdout.write(
            self.style.SUCCESS(f"Demo ready: users <tenant>-operator etc., password {password!r}")
        )

    def _tasks(self, tenant: Tenant, operator) -> None:
        worker = Actor.worker("seed-demo")
        soon = timezone.now()

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

        def wait(task, state: State, trigger: Trigger, step: str, hours: int, **extra):
            return advance(
                task.id,
                task.state_version,
                state,
                actor=worker,
                trigger=trigger,
                progress=checkpoints.Progress(step=step),
                wait_deadline=soon + timedelta(hours=hours),
                **extra,
            )

        start(
            "ready",
            "refund_request",
            "Refund order A-100 (eligible, no worker yet)",
            _refund("A-100", "12.50"),
        )
        if task := start(
            "input",
            "refund_request",
            "Refund order A-101: which item was damaged?",
            _refund("A-101", "49.00"),
        ):
            wait(task, State.WAITING_INPUT, Trigger.REQUEST_INPUT, "ask_customer", 48)
        if task := start(
            "approval", "refund_request", "Refund order A-102 (needs approval)", _refund("A-102", "420.00")
        ):
            wait(task, State.WAITING_APPROVAL, Trigger.REQUEST_APPROVAL, "request_approval", 24)
        if task := start(
            "external",
            "refund_request",
            "Refund order A-103: waiting for the return shipment",
            _refund("A-103", "89.90"),
        ):
            wait(task, State.WAITING_EXTERNAL, Trigger.AWAIT_EXTERNAL, "await_return", 72)
        if task := start(
            "retry", "order_lookup", "Look up order A-104 (order system unavailable)", {"order_id": "A-104"}
        ):
            wait(task, State.WAITING_RETRY, Trigger.ATTEMPT_FAILED, "lookup", 1, attempt=1)
        if task := start(
            "unknown", "refund_request", "Refund order A-105: payment timed out", _refund("A-105", "19.99")
        ):
            effect = {
                "kind": "refund",
                "order_id": "A-105",
                "amount": str(Decimal("19.99")),
                "currency": "USD",
            }
            advance(
                task.id,
                task.state_version,
                State.OUTCOME_UNKNOWN,
                actor=worker,
                trigger=Trigger.DISPATCH_UNKNOWN,
                reason="payments timed out after 10s",
                reason_code="dispatch_timeout",
                progress=checkpoints.Progress(step="refund"),
                actions=[ActionIntent(step="refund", connector="payments", effect=effect)],
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
        if task := start("completed", "order_lookup", "Look up order A-107", {"order_id": "A-107"}):
            advance(
                task.id,
                task.state_version,
                State.COMPLETED,
                actor=worker,
                trigger=Trigger.COMPLETE,
                progress=checkpoints.Progress(step="done", facts={"order_status": "delivered"}),
                outcome={"order_status": "delivered"},
            )
