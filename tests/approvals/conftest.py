"""Shared helpers for the approvals suites: a refund driven to ``waiting_approval``.

The refund runs in-process (``runner.run_task``) against the sandbox served by
``live_server``: evidence and effects travel over real HTTP. The task's owner is
the operator, so the operator is the requester of every approval it raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from runtime import runner
from runtime.llm import Model
from tasks import services
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.workflow import put_order

INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")
APPROVALS = "/api/approvals/"


@pytest.fixture
def sandbox(live_server, settings):
    """Point the connectors and evidence reads at the sandbox; order A-1 exists, delivered."""
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")


def run(task: Task, model: Model | None = None) -> Task:
    """One worker pass: run the task's steps until it waits or ends."""
    runner.run_task(task.id, worker_id="test-worker", region="default", model=model)
    return Task.objects.get(pk=task.pk)


def drive_to_approval(tenant, owner) -> Task:
    """Start a refund owned by ``owner`` and feed it until it waits for an approval."""
    task = run(make_task(tenant, owner=owner))
    assert task.state == State.WAITING_INPUT, task.state
    services.task_provide_input(task, expected_version=task.state_version, answer="mug", actor=INTEGRATOR)
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_EXTERNAL, task.state
    services.task_deliver_event(
        task,
        event_key=f"ship-{task.id}",
        event_type="shipment.returned",
        payload={"tracking_number": "TRK-1"},
        actor=INTEGRATOR,
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL, task.state
    return task


@pytest.fixture
def waiting(sandbox, acme, operator) -> Task:
    """A refund of order A-1 owned by the operator, waiting for its approval."""
    return drive_to_approval(acme, operator)


def pending_request(task: Task) -> ApprovalRequest:
    return ApprovalRequest.objects.get(task=task, status="pending")


def fresh(user):
    """The user reloaded: role and permission caches live on the instance."""
    return get_user_model().objects.get(pk=user.pk)


def effects(system: str) -> list[Effect]:
    """What the authoritative system performed (never what the ledger believes)."""
    return list(Effect.objects.filter(system=system).order_by("id"))


def triggers(task: Task) -> list[str]:
    return list(
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("trigger", flat=True)
    )


def decide_url(request: ApprovalRequest) -> str:
    return f"{APPROVALS}{request.pk}/decide/"


def detail_url(request: ApprovalRequest) -> str:
    return f"{APPROVALS}{request.pk}/"


def in_threads(*calls: Callable[[], Any], timeout: float = 30) -> list[Any]:
    """Run ``calls`` in parallel threads; each result or the exception it raised, in order.

    Every thread closes its own database connection so the test database can be dropped.
    """
    results: list[Any] = [None] * len(calls)

    def body(index: int, call: Callable[[], Any]) -> None:
        try:
            results[index] = call()
        except BaseException as exc:  # handed back to the test, which asserts on it
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=body, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive(), "a racing thread hung"
    return results
