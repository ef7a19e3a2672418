"""POST /api/tasks/<id>/<control>/: cancel, escalate, quarantine, release, retry.

Guarded by ``expected_version`` and the transition table; every refusal changes nothing.
"""

from __future__ import annotations

import pytest

from audit.models import TransitionEvent
from tasks.models import CancelRequest, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.api.conftest import control_body, in_waiting_retry, no_raise, post_json, post_raw, url
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("control", ["cancel", "escalate", "quarantine"])
def test_a_control_on_another_tenants_task_answers_404_and_changes_nothing(outsider, acme, control):
    task = make_task(acme)
    response = post_json(api_client_for(outsider), url(task, control), control_body())
    assert response.status_code == 404
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, stored.escalation_level) == (State.READY, 1, 0)


def test_an_unauthenticated_control_answers_401(acme):
    task = make_task(acme)
    assert post_json(api_client_for(None), url(task, "cancel"), control_body()).status_code == 401
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_cancel_at_the_current_version_is_applied(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(1))
    assert response.status_code == 200
    body = response.json()
    assert body["applied"] is True
    assert (body["task"]["state"], body["task"]["state_version"]) == ("cancel_requested", 2)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (State.CANCEL_REQUESTED, 2)


def test_cancel_records_its_scope_in_the_reason_code(operator, acme):
    task = make_task(acme)
    post_json(api_client_for(operator), url(task, "cancel"), control_body(1, scope="task"))
    assert TransitionEvent.objects.get(task=task, state_version=2).reason_code == "cancel:task"
    assert CancelRequest.objects.get(task=task).scope == "task"


def test_a_narrower_cancel_is_recorded_without_moving_the_task(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(1, scope="children"))
    assert response.status_code == 200, response.content
    assert response.json()["task"]["state_version"] == 1
    request = CancelRequest.objects.get(task=task)
    assert (request.scope, request.status) == ("children", "no_effect")
    assert request.resolution == "no child task was running"
    assert request.requested_by == f"user:{operator.username}"


def test_a_repeated_cancel_answers_200_without_applying_anything(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "cancel"), control_body(1))
    response = post_json(client, url(task, "cancel"), control_body(1))
    assert response.status_code == 200
    assert response.json()["applied"] is False
    assert response.json()["task"]["state_version"] == 2
    assert TransitionEvent.objects.filter(task=task).count() == 2


def test_a_stale_expected_version_is_a_409_with_the_current_state(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "escalate"), control_body(1))
    response = post_json(client, url(task, "cancel"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "stale_version"
    assert (response.json()["state"], response.json()["state_version"]) == ("ready", 2)
    assert Task.objects.get(pk=task.pk).state == State.READY


def test_an_expected_version_from_the_future_is_a_409_stale_version(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(9))
    assert response.status_code == 409
    assert response.json()["code"] == "stale_version"
    assert response.json()["state_version"] == 1


def test_release_on_a_ready_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "release"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "transition_not_allowed"
    assert (response.json()["state"], response.json()["state_version"]) == ("ready", 1)


def test_retry_on_a_ready_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "retry"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "transition_not_allowed"


def test_a_control_on_a_terminal_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    advance(task.id, 1, State.COMPLETED, actor=Actor.worker("w1"), trigger=Trigger.COMPLETE)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(2))
    assert response.status_code == 409
    assert (response.json()["code"], response.json()["state"]) == ("transition_not_allowed", "completed")


def test_a_control_without_a_reason_is_a_400_on_reason(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), {"expected_version": 1})
    assert response.status_code == 400
    assert "reason" in response.json()
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_control_without_an_expected_version_is_a_400(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), {"reason": "why not"})
    assert response.status_code == 400
    assert "expected_version" in response.json()


def test_an_unknown_cancel_scope_is_a_400_on_scope(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(1, scope="universe"))
    assert response.status_code == 400
    assert "scope" in response.json()


@pytest.mark.parametrize("control", ["cancel", "escalate", "quarantine"])
def test_an_auditor_may_not_use_a_control(auditor, acme, control):
    task = make_task(acme)
    assert post_json(api_client_for(auditor), url(task, control), control_body(1)).status_code == 403
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_an_approver_may_not_cancel(approver, acme):
    task = make_task(acme)
    assert post_json(api_client_for(approver), url(task, "cancel"), control_body(1)).status_code == 403


def test_an_admin_may_cancel(admin_user, acme):
    task = make_task(acme)
    response = post_json(api_client_for(admin_user), url(task, "cancel"), control_body(1))
    assert (response.status_code, response.json()["applied"]) == (200, True)


def test_escalate_bumps_the_escalation_level_and_keeps_the_state(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    response = post_json(client, url(task, "escalate"), control_body(1, escalate_to="approver"))
    assert response.status_code == 200
    detail = response.json()["task"]
    assert (detail["state"], detail["state_version"], detail["escalation_level"]) == ("ready", 2, 1)
    assert detail["escalation"] == {"level": 1, "to": "approver", "reason": "customer asked"}
    second = post_json(client, url(task, "escalate"), control_body(2))
    assert second.json()["task"]["escalation"]["level"] == 2


def test_quarantine_then_release_sends_the_task_to_resume_validation(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    quarantined = post_json(client, url(task, "quarantine"), control_body(1)).json()["task"]
    assert quarantined["state"] == "quarantined"
    response = post_json(client, url(task, "release"), control_body(2))
    assert response.status_code == 200
    released = response.json()["task"]
    assert (released["state"], released["state_version"]) == ("resume_validation", 3)


def test_a_repeated_quarantine_answers_200_without_applying_anything(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "quarantine"), control_body(1))
    response = post_json(client, url(task, "quarantine"), control_body(1))
    assert (response.status_code, response.json()["applied"]) == (200, False)


def test_retry_on_a_waiting_retry_task_sends_it_to_resume_validation(operator, acme):
    task = in_waiting_retry(make_task(acme))
    response = post_json(api_client_for(operator), url(task, "retry"), control_body(task.state_version))
    assert response.status_code == 200
    assert response.json()["task"]["state"] == "resume_validation"


def test_a_malformed_json_control_body_is_a_400(operator, acme):
    task = make_task(acme)
    response = post_raw(api_client_for(operator), url(task, "cancel"), b'{"expected_version": ')
    assert response.status_code == 400


def test_nul_characters_in_a_control_reason_are_a_400(operator, acme):
    task = make_task(acme)
    client = no_raise(api_client_for(operator))
    response = post_json(client, url(task, "cancel"), control_body(1, reason="a\x00b"))
    assert response.status_code == 400
    assert "reason" in response.json()


@pytest.mark.parametrize(
    "raw_version",
    ["2147483648", "9" * 40, "1" + "0" * 5000, "-1", "0", "1.5", "1e400", "true", '"x"', "null"],
    ids=["int32+1", "huge", "5001-digits", "negative", "zero", "fraction", "inf", "bool", "str", "null"],
)
def test_an_out_of_range_expected_version_is_a_400(operator, acme, raw_version):
    task = make_task(acme)
    raw = f'{{"expected_version": {raw_version}, "reason": "r"}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "cancel"), raw)
    assert response.status_code == 400
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_deeply_nested_control_body_is_a_4xx_not_a_500(operator, acme):
    task = make_task(acme)
    response = post_raw(no_raise(api_client_for(operator)), url(task, "cancel"), "[" * 50000)
    assert 400 <= response.status_code < 500
    assert Task.objects.get(pk=task.pk).state_version == 1
