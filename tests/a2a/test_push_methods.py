"""The A2A push-notification-config methods (a2a_api/push_methods.py) through the real a2a-sdk client in
process, and their refusals: a bad URL names the field, another tenant's task is TaskNotFound, the token
never comes back whole, a SendMessage with a push config keeps it (or, refused, starts nothing)."""

from __future__ import annotations

import pytest
from a2a.types import a2a_pb2

from a2a_api.rpc import error_metadata
from interop import push
from interop.models import PushConfig
from tasks.models import Task
from tests.a2a.loop import run_async
from tests.a2a.test_jsonrpc import BASE, data_message, key_for, rpc, with_client
from tests.conftest import REFUND_INPUT

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "receiver-secret-0123456789"
HOOK = "http://127.0.0.1:9/hook"


@pytest.fixture(autouse=True)
def a2a_settings(settings):
    settings.PUBLIC_BASE_URL = BASE
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.A2A_PUSH_ALLOWED_HOSTS = ["127.0.0.1"]


def start(key: str, message_id: str = "m-1", configuration: a2a_pb2.SendMessageConfiguration | None = None):
    async def send(client):
        request = a2a_pb2.SendMessageRequest(
            message=data_message(message_id, {"task_type": "refund_request", "input": REFUND_INPUT}),
            configuration=configuration,
        )
        return [event async for event in client.send_message(request)][0].task

    return run_async(with_client(key, send))


def test_the_real_client_creates_gets_lists_and_deletes_a_config(acme) -> None:
    key = key_for(acme)
    task_id = start(key).id

    async def scenario(client):
        created = await client.create_task_push_notification_config(
            a2a_pb2.TaskPushNotificationConfig(
                task_id=task_id,
                id="hook-1",
                url=HOOK,
                token=TOKEN,
                authentication=a2a_pb2.AuthenticationInfo(scheme="Bearer", credentials="cred-xyz"),
            )
        )
        default = await client.create_task_push_notification_config(
            a2a_pb2.TaskPushNotificationConfig(task_id=task_id, url=HOOK + "2")
        )
        read = await client.get_task_push_notification_config(
            a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task_id, id="hook-1")
        )
        listed = await client.list_task_push_notification_configs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        await client.delete_task_push_notification_config(
            a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="hook-1")
        )
        await client.delete_task_push_notification_config(  # again: done already, not an error
            a2a_pb2.DeleteTaskPushNotificationConfigRequest(task_id=task_id, id="hook-1")
        )
        after = await client.list_task_push_notification_configs(
            a2a_pb2.ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        with pytest.raises(Exception) as gone:
            await client.get_task_push_notification_config(
                a2a_pb2.GetTaskPushNotificationConfigRequest(task_id=task_id, id="hook-1")
            )
        return created, default, read, listed, after, type(gone.value).__name__

    created, default, read, listed, after, gone = run_async(with_client(key, scenario))
    assert (created.id, created.task_id, created.url) == ("hook-1", task_id, HOOK)
    assert created.token == "****" + TOKEN[-4:]  # never the whole token
    assert created.authentication.scheme == "Bearer" and created.authentication.credentials == ""
    assert default.id == task_id  # no id: the task's id, as the SDK's own server does
    assert read == created
    assert sorted(c.id for c in listed.configs) == sorted(["hook-1", task_id])
    assert [c.id for c in after.configs] == [task_id]
    assert gone == "TaskNotFoundError"
    kept = PushConfig.objects.get(config_id="hook-1")
    assert kept.deleted_at is not None and kept.created_by.username == "caller"
    assert push.secret(kept, "token") == TOKEN and push.secret(kept, "credentials") == "cred-xyz"
    assert TOKEN not in str(kept.secrets)


def test_a_refused_url_is_invalid_params_naming_the_field_and_nothing_is_kept(client, acme, settings) -> None:
    key = key_for(acme)
    task_id = start(key).id
    settings.A2A_PUSH_ALLOWED_HOSTS = []
    for url in ("http://127.0.0.1:9/hook", "http://169.254.169.254/latest", "ftp://example.com/x", ""):
        error = rpc(
            client, key, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": url, "token": TOKEN}
        ).json()["error"]
        assert (error["code"], error_metadata(error)["field"]) == (-32602, "url"), url

    async def through_the_client(client):
        with pytest.raises(Exception) as refused:
            await client.create_task_push_notification_config(
                a2a_pb2.TaskPushNotificationConfig(task_id=task_id, url="http://10.0.0.5/hook")
            )
        return type(refused.value).__name__, str(refused.value)

    kind, said = run_async(with_client(key, through_the_client))
    assert kind == "InvalidParamsError" and "url" in said
    assert not PushConfig.objects.exists()


def test_header_injection_in_token_or_authentication_is_refused_naming_the_field(client, acme) -> None:
    key = key_for(acme)
    task_id = start(key).id
    cases = {
        "token": {"token": "ok\r\nX-Evil: 1"},
        "authentication.scheme": {"authentication": {"scheme": "Bearer x", "credentials": "c"}},
        "authentication.credentials": {"authentication": {"scheme": "Bearer", "credentials": "c\nX: y"}},
        "id": {"id": "a" * 201},
    }
    for field, params in cases.items():
        error = rpc(
            client, key, "CreateTaskPushNotificationConfig", {"taskId": task_id, "url": HOOK, **params}
        ).json()["error"]
        assert (error["code"], error_metadata(error)["field"]) == (-32602, field)
    assert not PushConfig.objects.exists()


def test_another_tenants_task_is_task_not_found_for_every_method(client, acme, globex) -> None:
    task_id = start(key_for(acme)).id
    push.configure(Task.objects.get(), config_id="hook", url=HOOK, token=TOKEN)
    stranger = key_for(globex, "stranger")
    for method, params in (
        ("CreateTaskPushNotificationConfig", {"taskId": task_id, "url": HOOK}),
        ("GetTaskPushNotificationConfig", {"taskId": task_id, "id": "hook"}),
        ("ListTaskPushNotificationConfigs", {"taskId": task_id}),
        ("DeleteTaskPushNotificationConfig", {"taskId": task_id, "id": "hook"}),
    ):
        error = rpc(client, stranger, method, params).json()["error"]
        assert error["code"] == -32001, method
    assert PushConfig.objects.filter(deleted_at__isnull=True).count() == 1


def test_the_same_id_again_replaces_the_config_or_keeps_an_identical_one(acme) -> None:
    task = Task.objects.get(pk=start(key_for(acme)).id)
    first = push.configure(task, config_id="hook", url=HOOK, token=TOKEN)
    assert push.configure(task, config_id="hook", url=HOOK, token=TOKEN).pk == first.pk  # a retry
    second = push.configure(task, config_id="hook", url=HOOK + "b", token=TOKEN)
    assert second.pk != first.pk
    assert list(push.live_configs(task)) == [second]


def test_a_task_holds_at_most_the_cap_of_live_configs(client, acme) -> None:
    key = key_for(acme)
    task_id = start(key).id
    for n in range(push.MAX_CONFIGS_PER_TASK):
        assert "result" in rpc(client, key, "CreateTaskPushNotificationConfig",
                               {"taskId": task_id, "id": f"h{n}", "url": HOOK}).json()  # fmt: skip
    error = rpc(client, key, "CreateTaskPushNotificationConfig",
                {"taskId": task_id, "id": "one-more", "url": HOOK}).json()["error"]  # fmt: skip
    assert (error["code"], error_metadata(error)["field"]) == (-32602, "taskId")
    page = rpc(client, key, "ListTaskPushNotificationConfigs", {"taskId": task_id, "pageSize": 4}).json()
    assert len(page["result"]["configs"]) == 4 and page["result"]["nextPageToken"] == "h3"


def test_send_message_keeps_the_push_config_of_its_configuration(acme) -> None:
    key = key_for(acme)
    configuration = a2a_pb2.SendMessageConfiguration(
        task_push_notification_config=a2a_pb2.TaskPushNotificationConfig(id="on-send", url=HOOK, token=TOKEN)
    )
    task = start(key, configuration=configuration)
    kept = PushConfig.objects.get()
    assert (str(kept.task_id), kept.config_id, push.secret(kept, "token")) == (task.id, "on-send", TOKEN)
    start(key, configuration=configuration)  # the same message again: the same task, the same config
    assert PushConfig.objects.count() == 1


def test_send_message_with_a_refused_push_url_starts_nothing(client, acme) -> None:
    key = key_for(acme)
    sent = rpc(client, key, "SendMessage", {
        "message": {"messageId": "m-9", "role": "ROLE_USER",
                    "parts": [{"data": {"task_type": "refund_request", "input": REFUND_INPUT}}]},
        "configuration": {"taskPushNotificationConfig": {"url": "http://192.168.1.1/hook"}},
    }).json()  # fmt: skip
    assert sent["error"]["code"] == -32602
    assert error_metadata(sent["error"])["field"] == "configuration.taskPushNotificationConfig.url"
    assert not Task.objects.exists() and not PushConfig.objects.exists()


def test_the_card_says_push_notifications_are_served(client) -> None:
    card = client.get("/.well-known/agent-card.json").json()
    assert card["capabilities"]["pushNotifications"] is True
