"""The A2A v1.0 surface (POST /a2a/, the agent card) against the real a2a-sdk client, in process over ASGI,
and its protocol hygiene: every refusal a JSON-RPC error, nothing written."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from a2a.client import ClientConfig, create_client
from a2a.types import a2a_pb2
from django.utils import timezone
from google.protobuf import struct_pb2

from interop.models import A2AMessage
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tenancy.services import token_create
from tests.a2a.loop import run_async
from tests.conftest import REFUND_INPUT, make_user

BASE = "http://testserver"
V1 = {"A2A-Version": "1.0", "Content-Type": "application/json"}


@pytest.fixture
def a2a_settings(settings):
    settings.PUBLIC_BASE_URL = BASE
    settings.ALLOWED_HOSTS = ["testserver"]


def key_for(tenant, name="caller") -> str:
    user = make_user(name, tenant, Role.INTEGRATOR)
    _, key = token_create(user, scopes="read,integrate", expires_at=timezone.now() + timedelta(days=1))
    return key


def rpc(client, key, method, params, *, headers=None, rid=1):
    body = {"jsonrpc": "2.0", "id": rid, "method": method, "params": params}
    sent = {"A2A-Version": "1.0", "Authorization": f"Bearer {key}", **(headers or {})}
    return client.post("/a2a/", json.dumps(body), content_type="application/json", headers=sent)


def data_message(message_id: str, data: dict) -> a2a_pb2.Message:
    value = struct_pb2.Value()
    value.struct_value.update(data)
    return a2a_pb2.Message(message_id=message_id, role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(data=value)])


async def with_client(key: str, body):
    from config.asgi import application

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=application),
        base_url=BASE,
        headers={"Authorization": f"Bearer {key}"},
    ) as http:
        client = await create_client(BASE, client_config=ClientConfig(httpx_client=http, streaming=False))
        return await body(client)


@pytest.mark.django_db(transaction=True)
def test_the_real_client_reads_the_card_starts_a_task_once_per_message_and_reads_it(
    a2a_settings, acme, globex
):
    key = key_for(acme)

    async def scenario(client):
        started = [event async for event in client.send_message(
            a2a_pb2.SendMessageRequest(message=data_message("m-1", {"task_type": "refund_request",
                                                                   "input": REFUND_INPUT})))]  # fmt: skip
        again = [event async for event in client.send_message(
            a2a_pb2.SendMessageRequest(message=data_message("m-1", {"task_type": "refund_request",
                                                                   "input": REFUND_INPUT})))]  # fmt: skip
        task = started[0].task
        read = await client.get_task(a2a_pb2.GetTaskRequest(id=task.id))
        return task, again[0].task, read

    task, again, read = run_async(with_client(key, scenario))
    assert again.id == task.id  # the same messageId starts one task
    assert Task.objects.count() == 1 and A2AMessage.objects.count() == 1
    ours = Task.objects.get()
    assert str(ours.id) == task.id and ours.tenant == acme
    assert read.status.state == a2a_pb2.TASK_STATE_WORKING  # ready: still in our hands
    assert read.metadata["state"] == State.READY


@pytest.mark.django_db(transaction=True)
def test_cancel_and_tenant_isolation_through_the_real_client(a2a_settings, acme, globex):
    key, stranger = key_for(acme), key_for(globex, "stranger")

    async def start(client):
        events = [event async for event in client.send_message(
            a2a_pb2.SendMessageRequest(message=data_message("m-2", {"task_type": "refund_request",
                                                                   "input": REFUND_INPUT})))]  # fmt: skip
        return events[0].task.id

    task_id = run_async(with_client(key, start))

    async def other_tenant(client):
        with pytest.raises(Exception) as refused:
            await client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        return type(refused.value).__name__, str(refused.value)

    kind, said = run_async(with_client(stranger, other_tenant))
    assert kind == "TaskNotFoundError", (kind, said)  # -32001: as if it did not exist

    async def cancel(client):
        return await client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id))

    canceled = run_async(with_client(key, cancel))
    assert canceled.metadata["state"] in (State.CANCELED, State.CANCEL_REQUESTED)
    task = Task.objects.get()
    assert task.state in (State.CANCELED, State.CANCEL_REQUESTED)


@pytest.mark.django_db
def test_protocol_hygiene_every_refusal_is_a_json_rpc_error_and_nothing_is_written(
    client, a2a_settings, acme
):
    key = key_for(acme)
    auth = {"Authorization": f"Bearer {key}"}

    def post(raw: bytes | str, headers=None):
        return client.post(
            "/a2a/", raw, content_type="application/json", headers={**V1, **auth, **(headers or {})}
        )

    assert post(b"{not json").json()["error"]["code"] == -32700
    assert rpc(client, key, "message/send", {}).json()["error"]["code"] == -32601  # v0.3's name is not ours
    missing = client.post("/a2a/", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}),
                          content_type="application/json", headers=auth)  # fmt: skip
    assert missing.json()["error"]["code"] == -32009
    nobody = client.post("/a2a/", json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}),
                         content_type="application/json", headers={"A2A-Version": "1.0"})  # fmt: skip
    assert nobody.status_code == 401 and "error" in nobody.json()
    wrong = {"task_type": "refund_request", "input": {**REFUND_INPUT, "amount": "lots"}}
    bad_schema = rpc(client, key, "SendMessage", {"message": {"messageId": "m-3", "role": "ROLE_USER",
                                                              "parts": [{"data": wrong}]}})  # fmt: skip
    error = bad_schema.json()["error"]
    assert error["code"] == -32602 and "amount" in json.dumps(error)
    huge = post(
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"pad": "x" * 10_000_000}})
    )
    assert huge.json()["error"]["code"] in (-32600, -32602) and huge.status_code < 500
    for poison in ("a\u0000b", "\ud800"):
        sent = rpc(client, key, "SendMessage", {"message": {"messageId": "m-4", "role": "ROLE_USER",
                                                            "parts": [{"text": poison}]}})  # fmt: skip
        assert sent.status_code < 500 and sent.json()["error"]["code"] in (-32600, -32602, -32700)
    assert not Task.objects.exists() and not A2AMessage.objects.exists()


@pytest.mark.django_db
def test_the_card_names_our_absolute_endpoint_and_one_skill_per_task_type(client, a2a_settings):
    card = client.get("/.well-known/agent-card.json").json()
    assert card["supportedInterfaces"][0]["url"] == f"{BASE}/a2a/"
    assert card["capabilities"]["streaming"] is True
    assert {"refund_request", "pay_invoice"} <= {skill["id"] for skill in card["skills"]}


def test_the_docs_state_table_is_the_code_table():
    from pathlib import Path

    from interop.states import READINGS, TaskState

    page = (Path(__file__).resolve().parents[2] / "docs" / "building" / "a2a.md").read_text()
    for state, reading in READINGS.items():
        row = f"| `{state}` | `{TaskState.Name(reading.a2a)}` | {'yes' if reading.needs_person else 'no'} |"
        assert row in page, row
