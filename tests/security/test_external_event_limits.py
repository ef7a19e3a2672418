"""External events: refused on ended tasks, bounded per task (issue 12, reproduction 9).

Before: ``POST /api/tasks/{id}/external-events/`` stored every new ``event_key``
for ever, on finished tasks too. Now a new key on a terminal task is a 409
``task_ended`` and a task holds at most ``EXTERNAL_EVENTS_MAX_PER_TASK`` events
(409 ``too_many_events`` beyond); a repeated key still answers 200
``applied: false``, as it did, whatever the task's state.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tasks import services
from tasks.models import ExternalEvent, Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.api.conftest import post_json, url
from tests.approvals.conftest import in_threads
from tests.conftest import api_client_for, make_task, progress

INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


def deliver(user, task: Task, key: str, event_type: str = "note.added"):
    body: dict[str, Any] = {"event_key": key, "event_type": event_type, "payload": {"value": key}}
    return post_json(api_client_for(user), url(task, "external-events"), body)


def ended(task: Task) -> Task:
    return advance(task.id, task.state_version, State.FAILED, actor=Actor.worker("w1"), trigger=Trigger.FAIL)


def awaiting_return(task: Task) -> Task:
    """The refund waiting for ``shipment.returned`` at its ``await_return`` step."""
    return advance(
        task.id,
        task.state_version,
        State.WAITING_EXTERNAL,
        actor=Actor.worker("w1"),
        trigger=Trigger.AWAIT_EXTERNAL,
        progress=progress("await_return"),
        wait_deadline=timezone.now() + timedelta(days=1),
    )


@pytest.mark.django_db
def test_a_new_event_on_an_ended_task_is_a_409_with_its_state_and_nothing_is_stored(operator, acme):
    task = ended(make_task(acme))
    response = deliver(operator, task, "late-1")
    assert response.status_code == 409
    body = response.json()
    assert (body["code"], body["state"], body["state_version"]) == ("task_ended", "failed", 2)
    assert "already ended (failed)" in body["detail"]
    assert not ExternalEvent.objects.filter(task=task).exists()


@pytest.mark.django_db
def test_an_event_received_before_the_task_ended_is_still_acknowledged_when_repeated(operator, acme):
    task = make_task(acme)
    assert deliver(operator, task, "early-1").json()["applied"] is True  # kept until awaited
    task = ended(Task.objects.get(pk=task.pk))
    response = deliver(operator, task, "early-1")
    assert response.status_code == 200
    assert (response.json()["applied"], response.json()["note"]) == (
        False,
        "duplicate event_key: already received",
    )
    assert ExternalEvent.objects.filter(task=task).count() == 1


@pytest.mark.django_db
def test_a_task_takes_at_most_the_configured_number_of_events(operator, acme, settings):
    settings.EXTERNAL_EVENTS_MAX_PER_TASK = 3
    task = make_task(acme)
    assert [deliver(operator, task, f"e-{n}").status_code for n in range(3)] == [200, 200, 200]
    response = deliver(operator, task, "e-3")
    assert response.status_code == 409
    assert response.json()["code"] == "too_many_events"
    assert "3 external events" in response.json()["detail"]
    assert "EXTERNAL_EVENTS_MAX_PER_TASK" in response.json()["detail"]
    assert ExternalEvent.objects.filter(task=task).count() == 3


@pytest.mark.django_db
def test_a_repeat_past_the_limit_is_still_acknowledged(operator, acme, settings):
    settings.EXTERNAL_EVENTS_MAX_PER_TASK = 2
    task = make_task(acme)
    deliver(operator, task, "e-0")
    deliver(operator, task, "e-1")
    response = deliver(operator, task, "e-0")
    assert (response.status_code, response.json()["applied"]) == (200, False)


@pytest.mark.django_db
def test_the_event_a_task_waits_for_is_refused_too_once_it_holds_the_limit(operator, acme, settings):
    """The bound is per task, not per kind: a flood of other events cannot be followed by more."""
    settings.EXTERNAL_EVENTS_MAX_PER_TASK = 2
    task = make_task(acme)
    deliver(operator, task, "other-0")
    deliver(operator, task, "other-1")
    task = awaiting_return(Task.objects.get(pk=task.pk))
    response = deliver(operator, task, "ship-1", event_type="shipment.returned")
    assert (response.status_code, response.json()["code"]) == (409, "too_many_events")
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (State.WAITING_EXTERNAL, task.state_version)


@pytest.mark.django_db
def test_under_the_limit_the_awaited_event_still_ends_the_wait(operator, acme, settings):
    settings.EXTERNAL_EVENTS_MAX_PER_TASK = 2
    task = awaiting_return(make_task(acme))
    deliver(operator, task, "other-0")
    response = deliver(operator, task, "ship-1", event_type="shipment.returned")
    assert (response.status_code, response.json()["applied"]) == (200, True)
    assert Task.objects.get(pk=task.pk).state == State.RESUME_VALIDATION


@pytest.mark.django_db(transaction=True)
def test_concurrent_new_keys_never_store_more_than_the_limit(acme, settings):
    settings.EXTERNAL_EVENTS_MAX_PER_TASK = 4
    task = make_task(acme)

    def one(n: int):
        return lambda: services.task_deliver_event(
            Task.objects.get(pk=task.pk),
            event_key=f"race-{n}",
            event_type="note.added",
            payload={},
            actor=INTEGRATOR,
        )

    results = in_threads(*(one(n) for n in range(10)))
    refused = [r for r in results if isinstance(r, services.EventRefused)]
    assert all(isinstance(r, services.Delivery | services.EventRefused) for r in results), results
    assert len(refused) == 6 and {r.code for r in refused} == {"too_many_events"}
    assert ExternalEvent.objects.filter(task=task).count() == 4
