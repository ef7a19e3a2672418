"""What every demo case is seeded with, and the steps the cases share.

A case is a function of one ``Seeding`` (the tenant, its operator and second
approver, the seeding worker, one moment): it starts its task once
(``Seeding.start`` answers None when the task exists already, so seeding again
changes nothing) and drives it through real transitions to where the demo shows
it. The order records the tasks read as evidence are ``ORDERS`` (the sandbox's
``orders`` system, version 1 each).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from approvals import services as approvals
from approvals.models import ApprovalRequest
from demo.sandbox.models import Fault
from tasks import checkpoints, decisions, registry, services
from tasks.models import Task
from tasks.services import task_create
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Tenant

WORKER_ID = "seed-demo"  # the worker the cases' steps are recorded as taken by
# Where no worker runs: a task queued there is never leased (the stuck filter shows it).
STUCK_REGION = "eu-west"

ORDERS = {
    "A-100": {"status": "delivered", "total": "12.50", "currency": "USD", "card": "visa-4242"},
    "A-101": {"status": "delivered", "total": "49.00", "currency": "USD", "card": "visa-1881"},
    "A-102": {"status": "delivered", "total": "420.00", "currency": "USD", "card": "amex-0005"},
    "A-103": {"status": "delivered", "total": "89.90", "currency": "USD", "card": "mastercard-4444"},
    "A-104": {"status": "shipped", "total": "15.00", "currency": "USD", "card": "visa-4242"},
    "A-106": {"status": "delivered", "total": "150.00", "currency": "USD", "card": "visa-0077"},
    "A-107": {"status": "delivered", "total": "32.00", "currency": "USD", "card": "visa-4242"},
    "A-105": {"status": "delivered", "total": "64.00", "currency": "USD", "card": "visa-3003"},
    "A-108": {"status": "delivered", "total": "310.00", "currency": "USD", "card": "visa-1111"},
    "A-109": {"status": "delivered", "total": "27.00", "currency": "USD", "card": "visa-4242"},
    "A-110": {"status": "delivered", "total": "18.00", "currency": "USD", "card": "visa-4242"},
    "A-111": {"status": "delivered", "total": "21.00", "currency": "USD", "card": "visa-4242"},
    "A-112": {"status": "delivered", "total": "24.00", "currency": "USD", "card": "visa-4242"},
    "A-113": {"status": "shipped", "total": "11.00", "currency": "USD", "card": "visa-4242"},
    "A-114": {"status": "shipped", "total": "13.00", "currency": "USD", "card": "visa-4242"},
    "A-115": {"status": "delivered", "total": "35.00", "currency": "USD", "card": "visa-4242"},
    "A-116": {"status": "delivered", "total": "38.00", "currency": "USD", "card": "visa-4242"},
    "A-117": {"status": "delivered", "total": "58.00", "currency": "USD", "card": "visa-2020"},
    "A-118": {
        "status": "delivered",
        "total": "45.00",
        "currency": "USD",
        "card": "visa-4242",
    },  # the support agent's
    "A-119": {"status": "delivered", "total": "260.00", "currency": "USD", "card": "visa-6006"},
}


@dataclass(frozen=True)
class Seeding:
    """One tenant's seeding: who starts and decides the demo tasks, the worker that drives them, and
    the moment every deadline and evidence read counts from."""

    tenant: Tenant
    operator: Any
    approver: Any  # decides the requests the cases need decided (never the requester)
    worker: Actor
    now: datetime

    def start(
        self, key: str, task_type: str, objective: str, input: dict[str, Any], *, region: str | None = None
    ) -> Task | None:
        """Start demo task ``key`` once: the task on the first seed, None when it exists already."""
        task, created = task_create(
            tenant=self.tenant,
            task_type=task_type,
            objective=objective,
            input=input,
            owner=self.operator,
            idempotency_key=f"demo-{key}",
            actor=Actor.user(self.operator, ActorKind.INTEGRATOR),
            region=region,
        )
        return task if created else None

    def step(self, task: Task, progress: checkpoints.Progress, *, reason: str = "", **changes: Any) -> Task:
        """A step the worker took: ``ready`` again, at ``progress``."""
        return advance(
            task.id,
            task.state_version,
            State.READY,
            actor=self.worker,
            trigger=Trigger.STEP,
            progress=progress,
            reason=reason,
            **changes,
        )

    def wait(
        self,
        task: Task,
        state: State,
        trigger: Trigger,
        progress: checkpoints.Progress,
        *,
        hours: float,
        **changes: Any,
    ) -> Task:
        """Into the wait ``state`` at ``progress``, with a deadline ``hours`` from now."""
        return advance(
            task.id,
            task.state_version,
            state,
            actor=self.worker,
            trigger=trigger,
            progress=progress,
            wait_deadline=self.now + timedelta(hours=hours),
            **changes,
        )

    def read(
        self, task: Task, order: str, *, step: str, version: str = "1", **facts: Any
    ) -> checkpoints.Progress:
        """Where a task stands at ``step`` once ``order`` was read (at ``version``) and triaged."""
        evidence = [
            checkpoints.EvidenceRef(
                system="orders", record_id=order, record_version=version, fetched_at=self.now
            )
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

    def ask_approval(
        self, task: Task, progress: checkpoints.Progress, *, reason: str = "", why: str = ""
    ) -> tuple[Task, ApprovalRequest]:
        """Step to ``approve`` and ask for the payment's approval, as the engine does."""
        task = self.step(task, progress, reason=reason)
        kind = registry.get(task.task_type)
        approve = kind.step_as("approve", registry.RequestApproval)
        ask = approvals.request_decision(task, kind, approve, progress, now=self.now, why=why)
        task = decisions.commit(task, ask, actor=self.worker)
        return task, ApprovalRequest.objects.filter(task=task).latest("created_at")


# A demo case: seeds its task in one tenant (nothing when it was seeded already).
Case = Callable[[Seeding], None]


def task_facts(task: Task) -> dict[str, Any]:
    """The facts a task starts from: its input as submitted (sensitive fields are stored sealed,
    ``tasks.services.task_input``)."""
    return registry.get(task.task_type).initial_facts(services.task_input(task))


def standing_fault(system: str, operation: str, key: str) -> None:
    """Every ``operation`` call about ``key`` answers 503 until the fault is cleared (idempotent)."""
    params = {"key": key, "standing": True}
    queued = Fault.objects.filter(system=system, operation=operation, kind="error")
    if not any(fault.params == params for fault in queued):
        Fault.objects.create(system=system, operation=operation, kind="error", remaining=1, params=params)
