"""Who a cancel is recorded as, and whose task an A2A caller may cancel.

An integrator (an A2A caller's token) may cancel a task it started itself, and the audit event says so:
actor kind ``integrator``, the token's user, the calling client's token in the reason. An operator's
cancel (console, REST or A2A) stays the operator's. An integrator may not cancel another integrator's
task of the same tenant: ``TaskNotCancelable`` with ``data.reason`` ``not_started_by_caller`` (the task
is visible to it through ``GetTask``, so ``TaskNotFound`` would contradict what it can read). The REST
API's operator controls still refuse integrators (403), and an integrator's ``allowed_transitions``
still list no cancel.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from a2a.types import a2a_pb2
from django.utils import timezone

from a2a_api.rpc import error_metadata
from audit.models import TransitionEvent
from runtime import controls
from tasks.audit_paths import verify_chain
from tasks.models import Task
from tasks.states import ActorKind, State
from tenancy.models import Role
from tenancy.services import token_create
from tests.a2a.loop import run_async
from tests.a2a.test_jsonrpc import data_message, rpc, with_client
from tests.conftest import REFUND_INPUT, api_client_for, make_task, make_user


def caller(tenant, name: str, role: str = Role.INTEGRATOR):
    user = make_user(name, tenant, role)
    token, key = token_create(
        user, name=f"{name}-agent", scopes="read,integrate", expires_at=timezone.now() + timedelta(days=1)
    )
    return user, token, key


def start(client, key: str, message_id: str) -> str:
    params = {
        "message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"data": {"task_type": "refund_request", "input": REFUND_INPUT}}],
        }
    }
    answer = rpc(client, key, "SendMessage", params).json()
    return answer["result"]["task"]["id"]


@pytest.fixture
def a2a_settings(settings):
    settings.PUBLIC_BASE_URL = "http://testserver"
    settings.ALLOWED_HOSTS = ["testserver"]


def last_event(task_id) -> TransitionEvent:
    return TransitionEvent.objects.filter(task_id=task_id).latest("state_version")


@pytest.mark.django_db
def test_an_a2a_callers_cancel_of_its_own_task_is_recorded_as_the_integrator_and_its_token(
    client, a2a_settings, acme
):
    user, token, key = caller(acme, "agent-a")
    task_id = start(client, key, "own-1")

    answer = rpc(client, key, "CancelTask", {"id": task_id}).json()

    assert answer["result"]["metadata"]["state"] == State.CANCEL_REQUESTED
    event = last_event(task_id)
    assert (event.to_state, event.trigger) == (State.CANCEL_REQUESTED, "cancel")
    assert event.actor_kind == ActorKind.INTEGRATOR  # not lent the operator's kind any more
    assert event.actor_id == f"user:{user.get_username()}"
    assert token.prefix in event.reason and '"agent-a-agent"' in event.reason
    assert verify_chain(Task.objects.get(pk=task_id)) is None  # the table allows this step


@pytest.mark.django_db
def test_an_integrator_cannot_cancel_a_task_another_integrator_of_its_tenant_started(
    client, a2a_settings, acme
):
    _, _, owner_key = caller(acme, "agent-a")
    _, _, other_key = caller(acme, "agent-b")
    task_id = start(client, owner_key, "theirs-1")
    before = Task.objects.get(pk=task_id)

    assert rpc(client, other_key, "GetTask", {"id": task_id}).json()["result"]["id"] == task_id  # visible
    refused = rpc(client, other_key, "CancelTask", {"id": task_id}).json()

    assert refused["error"]["code"] == -32002  # TaskNotCancelable
    assert error_metadata(refused["error"])["reason"] == "not_started_by_caller"
    after = Task.objects.get(pk=task_id)
    assert (after.state, after.state_version) == (before.state, before.state_version)  # nothing written


@pytest.mark.django_db
def test_a_task_started_over_rest_by_someone_else_cannot_be_canceled_by_an_a2a_integrator(
    client, a2a_settings, acme
):
    _, _, key = caller(acme, "agent-a")
    task = make_task(acme)  # started by the system (no owner)

    refused = rpc(client, key, "CancelTask", {"id": str(task.id)}).json()

    assert error_metadata(refused["error"])["reason"] == "not_started_by_caller"
    assert Task.objects.get(pk=task.pk).state == State.READY


@pytest.mark.django_db
def test_an_operators_a2a_cancel_of_any_task_stays_the_operators(client, a2a_settings, acme):
    _, _, integrator_key = caller(acme, "agent-a")
    operator, _, operator_key = caller(acme, "ops", Role.OPERATOR)
    task_id = start(client, integrator_key, "ops-1")

    answer = rpc(client, operator_key, "CancelTask", {"id": task_id}).json()

    assert answer["result"]["metadata"]["state"] == State.CANCEL_REQUESTED
    event = last_event(task_id)
    assert (event.actor_kind, event.actor_id) == (ActorKind.OPERATOR, f"user:{operator.get_username()}")


@pytest.mark.django_db
def test_an_operators_rest_cancel_is_recorded_as_the_operator_even_of_a_task_they_started(operator, acme):
    task = make_task(acme, owner=operator)  # the operator also holds the integrator kind, and owns it

    answer = api_client_for(operator).post(
        f"/api/tasks/{task.id}/cancel/", {"expected_version": 1, "reason": "stop"}, format="json"
    )

    assert answer.status_code == 200, answer.json()
    event = last_event(task.id)
    assert (event.actor_kind, event.actor_id) == (ActorKind.OPERATOR, f"user:{operator.get_username()}")


@pytest.mark.django_db
def test_an_admins_cancel_is_recorded_as_the_admin(admin_user, acme):
    task = make_task(acme, owner=admin_user)

    controls.task_control(
        task, "cancel", user=admin_user, roles=frozenset({Role.ADMIN}), expected_version=1, reason="stop"
    )

    assert last_event(task.id).actor_kind == ActorKind.ADMIN


@pytest.mark.django_db
def test_rest_operator_controls_still_refuse_an_integrator_even_on_its_own_task(integrator, acme):
    task = make_task(acme, owner=integrator)
    api = api_client_for(integrator)

    body = {"expected_version": 1, "reason": "stop"}
    answer = api.post(f"/api/tasks/{task.id}/cancel/", body, format="json")

    assert answer.status_code == 403
    assert Task.objects.get(pk=task.pk).state == State.READY
    assert api.get(f"/api/tasks/{task.id}/").json()["allowed_transitions"] == []  # no cancel offered


@pytest.mark.django_db(transaction=True)
def test_the_sdk_client_reads_the_error_data_our_refusals_carry(a2a_settings, acme):
    _, _, owner_key = caller(acme, "agent-a")
    _, _, other_key = caller(acme, "agent-b")

    async def start(client):
        message = data_message("sdk-1", {"task_type": "refund_request", "input": REFUND_INPUT})
        return [event async for event in client.send_message(a2a_pb2.SendMessageRequest(message=message))]

    task_id = run_async(with_client(owner_key, start))[0].task.id

    async def refused(client, request):
        try:
            await request(client)
        except Exception as error:  # the a2a-sdk's error class for the code, ``data`` from our ErrorInfo
            return error
        raise AssertionError("not refused")

    cancel = await_cancel(task_id)
    not_cancelable = run_async(with_client(other_key, lambda client: refused(client, cancel)))
    assert type(not_cancelable).__name__ == "TaskNotCancelableError"
    assert not_cancelable.data["reason"] == "not_started_by_caller"

    async def bad_input(client):
        wrong = data_message(
            "sdk-2", {"task_type": "refund_request", "input": {**REFUND_INPUT, "amount": "lots"}}
        )
        return [event async for event in client.send_message(a2a_pb2.SendMessageRequest(message=wrong))]

    invalid = run_async(with_client(owner_key, lambda client: refused(client, bad_input)))
    assert type(invalid).__name__ == "InvalidParamsError"
    assert invalid.data["field"] == "message.parts.data.input"  # the field is named to SDK callers


def await_cancel(task_id: str):
    async def cancel(client):
        return await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id))

    return cancel
