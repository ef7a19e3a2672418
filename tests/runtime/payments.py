"""Shared helpers for runtime tests that pay invoices through the sandbox's payments system."""

from __future__ import annotations

import time
from collections.abc import Callable

from demo.sandbox.models import Effect, Fault
from ledger.models import Action
from runtime import controls, runner
from tasks.models import Task
from tests.conftest import make_task

INVOICE = {"invoice_id": "INV-1", "amount": "25.00", "currency": "EUR"}


def invoice_task(tenant, **input_overrides) -> Task:
    """A ``pay_invoice`` task (ready, version 1)."""
    invoice = {**INVOICE, **input_overrides}
    return make_task(tenant, task_type="pay_invoice", objective=f"Pay {invoice['invoice_id']}", input=invoice)


def run(task: Task) -> Task:
    """One claim of the in-process resume loop; the task as it stands after."""
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def fault(kind: str, **params) -> None:
    """The next payment suffers ``kind`` (see ``demo.sandbox.models.Fault``)."""
    Fault.objects.create(system="payments", operation="dispatch", kind=kind, params=params)


def late_payment(ms: int) -> None:
    """The next payment commits ``ms`` after it arrives: long after the caller timed out."""
    fault("latency", ms=ms)


def payments() -> int:
    return Effect.objects.filter(system="payments").count()


def cancel(task: Task, operator) -> Task:
    return controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="customer withdrew",
    ).task


def wait_until(predicate: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def landed(task: Task) -> bool:
    """The task's payment has reached the payments system (by its key: a late request of an
    earlier test may still land in the live server after that test)."""
    key = Action.objects.get(task=task).idempotency_key
    return Effect.objects.filter(idempotency_key=key).exists()
