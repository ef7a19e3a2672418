"""POST /api/tasks/{id}/rerun/: a new task linked to a failed, expired or canceled one."""

from __future__ import annotations

import pytest

from tasks import services
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.api.conftest import post_json, url
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db


def failed(tenant) -> Task:
    task = make_task(tenant)
    return advance(task.id, 1, State.FAILED, actor=Actor.worker("w"), trigger=Trigger.FAIL, reason="declined")


def test_rerun_answers_201_with_the_new_task_linked_both_ways(acme, operator):
    old = failed(acme)
    client = api_client_for(operator)
    response = post_json(client, url(old, "rerun"), {"reason": "card fixed"})
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["rerun_of"] == str(old.id) and body["state"] == State.READY and body["state_version"] == 1
    assert body["objective"] == old.objective
    # The same input, each copy sealed to its own task (answers show it masked).
    assert services.task_input(Task.objects.get(pk=body["id"])) == services.task_input(old)
    assert client.get(url(old)).json()["reruns"] == [body["id"]]
    assert client.get(url(Task.objects.get(pk=body["id"]))).json()["rerun_of"] == str(old.id)


def test_rerun_leaves_the_old_task_untouched(acme, operator):
    old = failed(acme)
    chain = list(old.events.order_by("state_version").values_list("hash", flat=True))
    post_json(api_client_for(operator), url(old, "rerun"), {"reason": "again"})
    stored = Task.objects.get(pk=old.pk)
    assert (stored.state, stored.state_version, stored.audit_head) == (State.FAILED, 2, old.audit_head)
    assert list(stored.events.order_by("state_version").values_list("hash", flat=True)) == chain


def test_rerun_of_a_task_that_has_not_ended_badly_is_409(acme, operator):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "rerun"), {"reason": "again"})
    assert response.status_code == 409
    assert (response.json()["code"], response.json()["state"]) == ("transition_not_allowed", State.READY)
    assert not Task.objects.filter(rerun_of=task).exists()


def test_rerun_of_another_tenants_task_is_404(acme, outsider):
    old = failed(acme)
    assert post_json(api_client_for(outsider), url(old, "rerun"), {"reason": "x"}).status_code == 404


def test_rerun_needs_the_operator_role_and_a_reason(acme, operator, auditor):
    old = failed(acme)
    assert post_json(api_client_for(auditor), url(old, "rerun"), {"reason": "x"}).status_code == 403
    assert post_json(api_client_for(operator), url(old, "rerun"), {}).status_code == 400


def test_rerun_with_the_same_key_answers_the_same_task_with_200(acme, operator):
    old = failed(acme)
    client = api_client_for(operator)
    first = post_json(client, url(old, "rerun"), {"reason": "x", "idempotency_key": "r-1"})
    again = post_json(client, url(old, "rerun"), {"reason": "x", "idempotency_key": "r-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
