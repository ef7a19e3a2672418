"""The A2A v1.0 push-notification-config methods: where a caller wants a task's status changes POSTed.

``CreateTaskPushNotificationConfig`` (params: a ``TaskPushNotificationConfig``),
``GetTaskPushNotificationConfig``, ``ListTaskPushNotificationConfigs`` and
``DeleteTaskPushNotificationConfig`` (params: ``taskId`` and ``id``) translate at the edge:
``interop.push`` keeps the configs (``PushConfig``, token and credentials sealed) and delivers
(``push.deliver_due``, run by ``run_worker --sweep`` and Celery beat). ``SendMessage``'s
``configuration.taskPushNotificationConfig`` is kept the same way (``methods.keep_push_config``).

- The task must be the caller's: another tenant's, or one the caller may not feed (the roles that start
  and answer tasks, ``methods.FEED_ROLES``), is ``TaskNotFound``; so is a config id the task never had.
- Every field is checked before anything is written; a refusal is invalid params naming the field
  (``url`` when the SSRF screen refuses it, ``interop.ssrf``).
- An empty ``id`` is the task id (as the a2a-sdk's own server does); the same ``id`` again replaces the
  config, or changes nothing when it is the same config (a retried request acts once).
- The token and credentials never travel back: the answer shows ``masked_token`` (``****`` and at most
  the last four characters) and the authentication scheme alone.
"""

from __future__ import annotations

from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import json_format

from a2a_api.methods import keep_push_config, parse, visible_task
from a2a_api.rpc import Call, Code, RpcError, method
from interop import push
from interop.models import PushConfig
from tasks.models import Task
from tasks.selectors import roles_in
from tenancy.models import FEED_ROLES

LIST_PAGE_MAX = 100


def _task(call: Call, task_id: str, tenant: str, field: str = "taskId") -> Task:
    """The caller's task, which the caller may feed (``methods.FEED_ROLES``); else ``TaskNotFound``."""
    if not task_id:
        raise RpcError(Code.INVALID_PARAMS, f"{field} is required.", {"field": field})
    task = visible_task(call, task_id, field)
    if (tenant and tenant != task.tenant.slug) or not roles_in(call.user, task) & set(FEED_ROLES):
        raise RpcError(Code.TASK_NOT_FOUND, "No such task.", {"field": field})
    return task


def _shown(config: PushConfig) -> a2a_pb2.TaskPushNotificationConfig:
    shown = a2a_pb2.TaskPushNotificationConfig(
        id=config.config_id,
        task_id=str(config.task_id),
        url=config.url,
        token=push.masked_token(push.secret(config, "token")),
    )
    if config.auth_scheme:
        shown.authentication.scheme = config.auth_scheme
    return shown


def _result(message: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(message)
    return result


@method("CreateTaskPushNotificationConfig")
def create_config(call: Call) -> dict[str, Any]:
    config = parse(call.params, a2a_pb2.TaskPushNotificationConfig())
    task = _task(call, config.task_id, config.tenant)
    kept = keep_push_config(call, config, task)
    assert kept is not None  # a task given: kept or refused
    return _result(_shown(kept))


def _one(call: Call, request: Any) -> tuple[Task, str]:
    task = _task(call, request.task_id, request.tenant)
    return task, request.id or str(task.id)


@method("GetTaskPushNotificationConfig")
def get_config(call: Call) -> dict[str, Any]:
    task, config_id = _one(call, parse(call.params, a2a_pb2.GetTaskPushNotificationConfigRequest()))
    config = push.live_configs(task).filter(config_id=config_id).first()
    if config is None:
        raise RpcError(Code.TASK_NOT_FOUND, "No push notification config by that id.", {"field": "id"})
    return _result(_shown(config))


@method("ListTaskPushNotificationConfigs")
def list_configs(call: Call) -> dict[str, Any]:
    """The task's live configs by id; ``pageToken`` is the last id of the page before."""
    request = parse(call.params, a2a_pb2.ListTaskPushNotificationConfigsRequest())
    task = _task(call, request.task_id, request.tenant)
    size = request.page_size or LIST_PAGE_MAX
    if not 1 <= size <= LIST_PAGE_MAX:
        raise RpcError(Code.INVALID_PARAMS, f"pageSize must be 1 to {LIST_PAGE_MAX}.", {"field": "pageSize"})
    configs = push.live_configs(task)
    if request.page_token:
        configs = configs.filter(config_id__gt=request.page_token)
    page = list(configs[: size + 1])
    more, page = len(page) > size, page[:size]
    response = a2a_pb2.ListTaskPushNotificationConfigsResponse(
        configs=[_shown(config) for config in page],
        next_page_token=page[-1].config_id if more else "",
    )
    return _result(response)


@method("DeleteTaskPushNotificationConfig")
def delete_config(call: Call) -> dict[str, Any]:
    """No more deliveries to that config (those sent stay recorded); deleting it again is done."""
    task, config_id = _one(call, parse(call.params, a2a_pb2.DeleteTaskPushNotificationConfigRequest()))
    if not push.delete_config(task, config_id):
        raise RpcError(Code.TASK_NOT_FOUND, "No push notification config by that id.", {"field": "id"})
    return {}
