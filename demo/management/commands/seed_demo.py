"""manage.py seed_demo: demo tenants, users and tasks (idempotent; refuses in production).

Tenants ``acme`` and ``globex``; in each, users ``<tenant>-operator``,
``-approver``, ``-approver2``, ``-auditor``, ``-admin``, ``-integrator`` with password
``$DEMO_PASSWORD`` (default ``demo``), the approvers and admins with an authenticator
device on the public ``DEMO_TOTP_SECRET`` (printed, and in the README: any TOTP app
gives their second factor; never a secret outside the demo); the sandbox order records, policies and
approved runtime configs; two tasks ready for the workers to drive, and, per
tenant, a standing case of every kind an operator triages. None of the standing
cases resolves by itself while ``make demo`` runs (web, worker, beat):

- waiting for input, an external event (days-long deadlines) and a retry (a
  short one the sweep resumes, and one whose backoff runs for hours);
- quarantined for each reason: a corrupt checkpoint, one whose migration fails, a
  step error, a digest mismatch, an operator's hold (quarantine is only left by an
  operator's release); and a task whose checkpoint a newer deployment wrote, left
  untouched by this one's workers (a mixed-version rollout);
- an outcome unknown whose payments system answers every lookup of that key with
  an error (a standing sandbox fault), so the reconciler can never settle it and,
  past the demo's threshold (``run_demo``: 60 s), escalates it;
- a stuck task: runnable in region ``eu-west``, where no worker runs, so nobody
  leases it (the stuck filter shows it ``STUCK_AFTER`` after seeding);
- a parent waiting on its children (``waiting_children``), which are queued in that
  same region (and a batch in the workers' region that runs to its end);
- a failed task to rerun; approvals pending, one of them a repeat request for the
  same task after the order record changed; a task with a long history (400 steps).

Everything is written through real transitions (foreign checkpoints with
``demo.foreign.written_as``, tampering by SQL as tampering is), so each task's
audit chain verifies.
"""

from __future__ import annotations

import base64
import functools
import json
import os
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

from approvals import services as approvals
from approvals.models import ApprovalRequest
from demo.foreign import written_as
from demo.sandbox.models import Effect, Fault, Record
from ledger.models import IN_DOUBT, Action, DispatchState
from ledger.services import action_move
from runtime import controls, runner
from tasks import checkpoints, decisions, leases, registry, services
from tasks.models import Checkpoint, Policy, RuntimeConfig, Task
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
    "integrator": [Role.INTEGRATOR],  # a system's account: start tasks, feed input and events
}

# The demo's authenticator secret (base32), the same for every demo approver and admin so the tour
# can show the second factor: add it to any TOTP app. Public, like the demo password.
DEMO_TOTP_SECRET = "DURABLEAGENTSDEMOSECRETNOTFORUSE"


def give_demo_device(user: Any) -> None:
    """A confirmed authenticator on ``DEMO_TOTP_SECRET`` for ``user``, unless one is enrolled already."""
    if not TOTPDevice.objects.filter(user=user, confirmed=True).exists():
        key = base64.b32decode(DEMO_TOTP_SECRET).hex()
        TOTPDevice.objects.create(user=user, name="demo authenticator", key=key, confirmed=True)


def _refund(order: str, amount: str) -> dict[str, str]:
    return {
        "order_id": order,
        "customer_email": f"customer+{order}@example.com",
        "amount": amount,
        "currency": "USD",
        "reason": "Item arrived damaged",
    }


class Command(BaseCommand):
    help = "Create demo tenants, users and tasks (idempotent). Refuses to run with DEBUG off."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--code",
            action="store_true",
            help="only print the demo authenticator's code of the moment (for a laptop without a TOTP app)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.DEBUG:
            raise CommandError("seed_demo refuses to run under production settings (DEBUG is off).")
        if options["code"]:
            self.stdout.write(f"{TOTP(base64.b32decode(DEMO_TOTP_SECRET)).token():06d}")
            return
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
                if {Role.APPROVER, Role.ADMIN} & set(roles):
                    give_demo_device(user)
            operator = User.objects.get(username=f"{slug}-operator")
            self._tasks(tenant, operator)
            self._standing(tenant, operator, User.objects.get(username=f"{slug}-approver2"))
        self.stdout.write(
            self.style.SUCCESS(f"Demo ready: users <tenant>-operator etc., password {password!r}")
        )
        self.stdout.write(
            "Approvers and admins give a second factor: add the demo secret "
            f"{DEMO_TOTP_SECRET} to any authenticator app (TOTP, 6 digits, 30 s)."
        )

    def _lost_answer(self, task: Task, worker: Actor) -> None:
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

    def _tasks(self, tenant: Tenant, operator: AbstractBaseUser) -> None:
        worker = Actor.worker("seed-demo")
        now = timezone.now()

        start = functools.partial(_start, tenant, operator)

        def read(order: str, **facts: Any) -> checkpoints.Progress:
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

        def wait(
            task: Task,
            state: State,
            trigger: Trigger,
            step: str,
            hours: float,
            progress: checkpoints.Progress,
            **extra: Any,
        ) -> Task:
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
        start(
            "batch",
            "order_batch",
            "Look up orders A-110, A-111 and A-112 (one child task each)",
            {"order_ids": ["A-110", "A-111", "A-112"]},
        )
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
        if task := start(
            "canceled",
            "refund_request",
            "Refund order A-117 (canceled after its ticket was opened)",
            _refund("A-117", "58.00"),
        ):
            progress = read("A-117", damaged_item="mug", return_tracking="TRK-A117")
            self._ticket_left_open(task, worker, operator, progress)

    def _ticket_left_open(
        self, task: Task, worker: Actor, operator: AbstractBaseUser, progress: checkpoints.Progress
    ) -> None:
        """The ticket is opened (its effect is in the sandbox), then an operator cancels the refund.
        The running demo's worker confirms the cancel: its report lists the ticket as not undone,
        and the task page offers close_ticket to undo it (a compensation run)."""
        step = registry.get(task.task_type).step_as("open_ticket", registry.Dispatch)
        facts = {**task_facts(task), **progress.facts}
        effect = step.effect(facts)
        task = advance(
            task.id,
            task.state_version,
            State.READY,
            actor=worker,
            trigger=Trigger.STEP,
            progress=progress.model_copy(update={"step": "open_ticket", "facts": facts}),
            actions=[ActionIntent(step="open_ticket", connector="tickets", effect=effect)],
            reason="intends tickets: ticket.open",
        )
        action = Action.objects.get(task=task)
        opened, _ = Effect.objects.get_or_create(
            system="tickets", idempotency_key=action.idempotency_key, defaults={"request": effect}
        )
        action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
        action_move(
            action.pk, DispatchState.DISPATCHING, DispatchState.SUCCEEDED, external_ref=str(opened.pk)
        )
        controls.task_control(
            task,
            "cancel",
            user=operator,
            roles=frozenset({Role.OPERATOR}),
            expected_version=task.state_version,
            reason="the customer withdrew the claim",
        )

    def _standing(self, tenant: Tenant, operator: AbstractBaseUser, approver: AbstractBaseUser) -> None:
        """The cases an operator triages that nothing in the running demo resolves."""
        worker = Actor.worker("seed-demo")
        now = timezone.now()

        start = functools.partial(_start, tenant, operator)

        def refund(key: str, order: str, objective: str) -> Task | None:
            return start(key, "refund_request", objective, _refund(order, ORDERS[order]["total"]))

        def step(task: Task, progress: checkpoints.Progress, *, reason: str = "", **changes: Any) -> Task:
            return advance(
                task.id,
                task.state_version,
                State.READY,
                actor=worker,
                trigger=Trigger.STEP,
                progress=progress,
                reason=reason,
                **changes,
            )

        def ask_customer(task: Task) -> Task:
            progress = _read(task, task.input["order_id"], now, step="ask_customer")
            return advance(
                task.id,
                task.state_version,
                State.WAITING_INPUT,
                actor=worker,
                trigger=Trigger.REQUEST_INPUT,
                progress=progress,
                wait_deadline=now + timedelta(hours=48),
            )

        # Quarantined: checkpoints the running code cannot read, each written by a real transition
        # (the "other code" through written_as) and found unreadable the way a worker finds it.
        newer = checkpoints.CURRENT_SCHEMA + 1
        unreadable: dict[str, tuple[str, str, dict[str, Any]]] = {
            "q-newer": (
                "A-110",
                "written by a newer deployment",
                {
                    "body": json.dumps(
                        {"schema_version": newer, "step": "ask_customer", "deployment": "next"}
                    ),
                    "schema_version": newer,
                },
            ),
            "q-corrupt": (
                "A-111",
                "its checkpoint does not decode",
                {"body": '{"schema_version": 2, "step": '},
            ),
            "q-unmigratable": (
                "A-112",
                "an old checkpoint no migration reads",
                {"body": '{"schema_version": 0, "position": "ask_customer"}', "schema_version": 0},
            ),
        }
        for key, (order, why, fields) in unreadable.items():
            if task := refund(key, order, f"Refund order {order} ({why})"):
                with written_as(**fields):
                    task = ask_customer(task)
                services.task_resume_point(task.id, actor=worker)
        if task := refund(
            "q-tampered", "A-115", "Refund order A-115 (its checkpoint was edited behind our back)"
        ):
            task = ask_customer(task)
            row = Checkpoint.objects.get(task=task, state_version=task.state_version)
            body = json.loads(row.body)
            body["facts"]["amount"] = "9999.00"
            Checkpoint.objects.filter(pk=row.pk).update(body=json.dumps(body))  # tampering, by SQL
            services.task_resume_point(task.id, actor=worker)
        if task := refund("q-step-error", "A-116", "Refund order A-116 (a step raised)"):
            # The worker's own path: a claimed lease, then what the runner does when a step raises.
            lease = leases.claim(task.id, worker_id="seed-demo", region=task.region)
            if lease is not None:
                try:
                    runner._quarantine_after_error(task.id, worker, lease, KeyError("refund_card"))
                finally:
                    leases.release(lease)

        # An outcome unknown the payments system will not answer about (see _standing_fault).
        for action in Action.objects.filter(task__tenant=tenant, task__idempotency_key="demo-unknown"):
            if action.dispatch_state in IN_DOUBT:
                _standing_fault(action.connector, "lookup", action.idempotency_key)

        # Stuck: runnable, but in a region where no worker runs, so nobody ever leases it.
        start(
            "stuck",
            "order_lookup",
            f"Look up order A-113 (queued in region {STUCK_REGION}, where no worker runs)",
            {"order_id": "A-113"},
            region=STUCK_REGION,
        )

        # A parent waiting on its children: they are queued in the same region, where no worker runs.
        if task := start(
            "children",
            "order_batch",
            f"Look up orders A-115 and A-116 (children queued in region {STUCK_REGION})",
            {"order_ids": ["A-115", "A-116"]},
            region=STUCK_REGION,
        ):
            runner.run_task(task.id, worker_id="seed-demo", region=STUCK_REGION)  # starts the children

        # A retry whose backoff runs for hours (the short one in _tasks is resumed by the sweep).
        if task := start(
            "retry-long",
            "order_lookup",
            "Look up order A-114 (order system down; next attempt in 12 hours)",
            {"order_id": "A-114"},
        ):
            advance(
                task.id,
                task.state_version,
                State.WAITING_RETRY,
                actor=worker,
                trigger=Trigger.ATTEMPT_FAILED,
                progress=checkpoints.Progress(step="lookup", facts=task_facts(task)),
                reason="orders answered 503",
                reason_code="evidence_unavailable",
                attempt=2,
                wait_deadline=now + timedelta(hours=12),
            )

        # Failed (an approver said no): the operator may rerun it.
        if task := refund("failed", "A-105", "Refund order A-105 (rejected by the approver)"):
            task, request = _ask_approval(task, worker, _read(task, "A-105", now, step="approve"), now)
            approvals.approval_decide(
                request,
                user=approver,
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
                actor=worker,
                trigger=Trigger.PROCEED,
                progress=progress,
                reason_code="revalidated",
            )
            advance(
                task.id,
                task.state_version,
                State.FAILED,
                actor=worker,
                trigger=Trigger.FAIL,
                progress=progress.model_copy(update={"step": "approval_rejected"}),
                reason_code="refund_rejected_by_approver",
                outcome={"reason": "refund_rejected_by_approver"},
            )

        # A repeat approval request: approved, then the order record changed (v1 -> v2, a new
        # card), the task refreshed its evidence and asks again for the changed payment.
        if task := refund("reapproval", "A-108", "Refund order A-108: approve again (the order changed)"):
            task, first = _ask_approval(task, worker, _read(task, "A-108", now, step="approve"), now)
            approvals.approval_decide(first, user=approver, decision="approve", digest_seen=first.digest)
            record = Record.objects.get(system="orders", record_id="A-108")
            if record.version == 1:
                Record.objects.filter(pk=record.pk).update(
                    data={**record.data, "card": CHANGED_CARD}, version=2
                )
            task = Task.objects.get(pk=task.pk)
            kind = registry.get(task.task_type)
            task = advance(
                task.id,
                task.state_version,
                State.READY,
                actor=worker,
                trigger=Trigger.REFRESH,
                progress=services.latest_checkpoint(task).progress.model_copy(
                    update={"step": kind.replan_step}
                ),
                reason="evidence changed: orders/A-108 v1 -> v2",
                reason_code="evidence_changed",
            )
            again = _read(task, "A-108", now, step="approve", version="2", refund_card=CHANGED_CARD)
            task = step(task, again, reason="read orders/A-108 v2")
            approve = kind.step_as("approve", registry.RequestApproval)
            ask = approvals.request_decision(
                task,
                kind,
                approve,
                again,
                now=now,
                why="re-approval: the action changed since it was approved",
            )
            decisions.commit(task, ask, actor=worker)

        # A long history: a refund the model and the customer went back and forth on.
        if task := refund("long-history", "A-109", f"Refund order A-109 ({LONG_HISTORY} steps of history)"):
            for turn in range(1, LONG_HISTORY + 1):
                progress = _read(task, "A-109", now, step="triage", turn=turn)
                task = step(task, progress, reason=f"turn {turn}: the customer's answer is still unclear")
            advance(
                task.id,
                task.state_version,
                State.WAITING_EXTERNAL,
                actor=worker,
                trigger=Trigger.AWAIT_EXTERNAL,
                progress=_read(task, "A-109", now, step="await_return", damaged_item="jug"),
                wait_deadline=now + timedelta(days=30),
            )


def _read(
    task: Task, order: str, now: datetime, *, step: str, version: str = "1", **facts: Any
) -> checkpoints.Progress:
    """Where a refund stands once ``order`` was read (at ``version``) and triaged."""
    evidence = [
        checkpoints.EvidenceRef(system="orders", record_id=order, record_version=version, fetched_at=now)
    ]
    order_facts = {
        "order_status": "delivered",
        "order_total": ORDERS[order]["total"],
        "refund_card": ORDERS[order]["card"],
        "triage": "refund",
    }
    return checkpoints.Progress(
        step=step, facts={**task_facts(task), **order_facts, **facts}, evidence=evidence
    )


def _ask_approval(
    task: Task, worker: Actor, progress: checkpoints.Progress, now: datetime
) -> tuple[Task, ApprovalRequest]:
    """Step to ``approve`` and ask for the payment's approval, as the engine does."""
    task = advance(
        task.id, task.state_version, State.READY, actor=worker, trigger=Trigger.STEP, progress=progress
    )
    kind = registry.get(task.task_type)
    ask = approvals.request_decision(
        task, kind, kind.step_as("approve", registry.RequestApproval), progress, now=now
    )
    task = decisions.commit(task, ask, actor=worker)
    return task, ApprovalRequest.objects.filter(task=task).latest("created_at")


def _standing_fault(system: str, operation: str, key: str) -> None:
    """Every ``operation`` call about ``key`` answers 503 until the fault is cleared (idempotent)."""
    params = {"key": key, "standing": True}
    queued = Fault.objects.filter(system=system, operation=operation, kind="error")
    if not any(fault.params == params for fault in queued):
        Fault.objects.create(system=system, operation=operation, kind="error", remaining=1, params=params)


STUCK_REGION = "eu-west"
LONG_HISTORY = 400
CHANGED_CARD = "visa-5556"

ORDERS = {
    "A-100": {"status": "delivered", "total": "12.50", "card": "visa-4242"},
    "A-101": {"status": "delivered", "total": "49.00", "card": "visa-1881"},
    "A-102": {"status": "delivered", "total": "420.00", "card": "amex-0005"},
    "A-103": {"status": "delivered", "total": "89.90", "card": "mastercard-4444"},
    "A-104": {"status": "shipped", "total": "15.00", "card": "visa-4242"},
    "A-106": {"status": "delivered", "total": "150.00", "card": "visa-0077"},
    "A-107": {"status": "delivered", "total": "32.00", "card": "visa-4242"},
    "A-105": {"status": "delivered", "total": "64.00", "card": "visa-3003"},
    "A-108": {"status": "delivered", "total": "310.00", "card": "visa-1111"},
    "A-109": {"status": "delivered", "total": "27.00", "card": "visa-4242"},
    "A-110": {"status": "delivered", "total": "18.00", "card": "visa-4242"},
    "A-111": {"status": "delivered", "total": "21.00", "card": "visa-4242"},
    "A-112": {"status": "delivered", "total": "24.00", "card": "visa-4242"},
    "A-113": {"status": "shipped", "total": "11.00", "card": "visa-4242"},
    "A-114": {"status": "shipped", "total": "13.00", "card": "visa-4242"},
    "A-115": {"status": "delivered", "total": "35.00", "card": "visa-4242"},
    "A-116": {"status": "delivered", "total": "38.00", "card": "visa-4242"},
    "A-117": {"status": "delivered", "total": "58.00", "card": "visa-2020"},
}


def _start(
    tenant: Tenant,
    operator: AbstractBaseUser,
    key: str,
    task_type: str,
    objective: str,
    input: dict[str, Any],
    region: str | None = None,
) -> Task | None:
    """Start demo task ``key`` once: the task on the first seed, None when it exists already."""
    task, created = task_create(
        tenant=tenant,
        task_type=task_type,
        objective=objective,
        input=input,
        owner=operator,
        idempotency_key=f"demo-{key}",
        actor=Actor.user(operator, ActorKind.INTEGRATOR),
        region=region,
    )
    return task if created else None


def task_facts(task: Task) -> dict[str, Any]:
    # The input as submitted: its sensitive fields are stored sealed (tasks.services.task_input).
    return registry.get(task.task_type).initial_facts(services.task_input(task))


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
