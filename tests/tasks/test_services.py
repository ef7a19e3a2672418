"""Feeding a waiting task (``tasks.services``): answers and external events apply once.

A refund is driven to its waits by the in-process resume loop against the
sandbox over real HTTP; the model is the deterministic scripted one.
"""

from __future__ import annotations

import pytest

from audit.models import TransitionEvent
from runtime import runner
from tasks import services
from tasks.models import ExternalEvent, Task, TaskInput
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def waiting_for_input(tenant, **overrides) -> Task:
    task = run(make_task(tenant, **overrides))
    assert task.state == State.WAITING_INPUT
    return task


def answer(task: Task, text: str = "mug") -> Task:
    services.task_provide_input(task, expected_version=task.state_version, answer=text, actor=INTEGRATOR)
    return Task.objects.get(pk=task.pk)


def test_the_same_answer_posted_twice_applies_once(acme):
    task = waiting_for_input(acme)
    version = task.state_version
    first = services.task_provide_input(task, expected_version=version, answer="mug", actor=INTEGRATOR)
    again = services.task_provide_input(
        Task.objects.get(pk=task.pk), expected_version=version, answer="mug", actor=INTEGRATOR
    )
    assert (first.applied, again.applied) == (True, False)
    assert TaskInput.objects.filter(task=task).count() == 1
    assert Task.objects.get(pk=task.pk).state_version == version + 1


def test_a_duplicate_external_event_applies_once(acme, approver):
    task = run(answer(waiting_for_input(acme)))
    assert task.state == State.WAITING_EXTERNAL
    deliveries = [
        services.task_deliver_event(
            Task.objects.get(pk=task.pk),
            event_key="ship-1",
            event_type="shipment.returned",
            payload={"tracking_number": "TRK-1"},
            actor=INTEGRATOR,
        )
        for _ in range(3)
    ]
    assert [d.applied for d in deliveries] == [True, False, False]
    assert ExternalEvent.objects.filter(task=task).count() == 1
    assert TransitionEvent.objects.filter(task=task, trigger="external_event").count() == 1
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL
    approve(task, approver)
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED and task.outcome["return_tracking"] == "TRK-1"


def test_an_event_that_arrives_early_is_kept_and_applied_when_the_task_waits_for_it(acme):
    task = waiting_for_input(acme)
    early = services.task_deliver_event(
        task,
        event_key="ship-0",
        event_type="shipment.returned",
        payload={"tracking_number": "EARLY"},
        actor=INTEGRATOR,
    )
    assert early.applied and "stored" in early.note
    task = run(answer(Task.objects.get(pk=task.pk)))
    assert task.state == State.WAITING_APPROVAL  # went straight past waiting_external
    assert TransitionEvent.objects.filter(task=task, trigger="await_external").count() == 0
    assert services.latest_checkpoint(task).facts["return_tracking"] == "EARLY"
