"""The A2A v1.0 methods we serve (non-streaming), each registered in ``rpc.METHODS`` with ``@method``.

Starting a task (``SendMessage`` without ``taskId``) — the message's parts:

- a data part ``{"task_type": "<type>", "input": {…}}`` (``taskType`` is accepted too; optional
  ``"objective": "<text>"``) starts that type with that input, checked against the type's input schema
  (the card's skill, ``/api/task-types/<type>/``);
- a text part alone starts ``A2A_DEFAULT_TASK_TYPE`` with the text as its objective (refused when
  that setting is empty); with a data part, a text part is the objective.

Input the type refuses creates nothing and answers invalid params (-32602) with the fields named in
``error.data.fields``: no task exists to report as ``TASK_STATE_REJECTED``, so a rejected task id would
name nothing ``GetTask`` could find.

Answering (``SendMessage`` with ``taskId``): the task must be ``waiting_input``; the answer is the
text of a text part, or a data part ``{"answer": <string|number|boolean>}``.

Idempotency: ``messageId`` per tenant (``interop.A2AMessage``). The same id with the same content
answers the task it started or answered, and acts no second time; the same id with other content is
invalid params naming ``message.messageId``.

We never block a ``SendMessage`` until the task ends (tasks wait for days): the answer is the task as it
is once the message is recorded; follow it with ``GetTask``, a stream or a push config.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any, TypeVar

from a2a.types import a2a_pb2
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import Http404
from google.protobuf import json_format
from google.protobuf.message import Message

from a2a_api.card import agent_card
from a2a_api.rpc import Call, Code, RpcError, method
from audit.models import TransitionEvent
from interop import push, wire
from interop.models import A2AMessage, PushConfig
from interop.states import READINGS
from protection.reveal import masked_outcome
from reads import visibility
from reads.task_types import contracts
from runtime import controls
from tasks import registry, services
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.selectors import roles_in
from tasks.states import TERMINAL, ActorKind, State
from tasks.transitions import Actor
from tenancy.models import FEED_ROLES, Tenant
from tenancy.selectors import tenants_for

MAX_MESSAGE_ID = 190  # the task's idempotency key is "a2a:<messageId>" (200 characters at most)
MAX_OBJECTIVE = 5000
MAX_ANSWER = 2000
LIST_PAGE_SIZE = 50
LIST_PAGE_MAX = 100
HISTORY_MAX = 1000

P = TypeVar("P", bound=Message)


# --- reading params and tasks ------------------------------------------------------------------


def parse(params: dict[str, Any], message: P) -> P:
    """``params`` as the request message ``message`` (ProtoJSON); unknown or mistyped fields are
    invalid params, named."""
    try:
        json_format.ParseDict(params, message)
    except json_format.ParseError as exc:
        raise RpcError(
            Code.INVALID_PARAMS, f"Invalid params: {exc}", {"field": _field_of(str(exc))}
        ) from None
    return message


def _field_of(text: str) -> str:
    """The field a protobuf ParseError names (its "field named" or "field:" part)."""
    if 'field named "' in text:
        return text.split('field named "', 1)[1].split('"', 1)[0]
    if " field: " in text:
        return text.split(" field: ", 1)[1].split(" ", 1)[0].rstrip(".")
    return "params"


def visible_task(call: Call, task_id: str, field: str = "id") -> Task:
    """The caller's task; another tenant's task, a malformed id or none at all: ``TaskNotFound``."""
    try:
        key = uuid.UUID(task_id)
    except ValueError:
        raise RpcError(Code.TASK_NOT_FOUND, "No such task.", {"field": field}) from None
    try:
        return visibility.get_visible_task(call.user, key)
    except Http404:
        raise RpcError(Code.TASK_NOT_FOUND, "No such task.", {"field": field}) from None


def task_message(task: Task, *, history_length: int = 0, artifacts: bool = True) -> a2a_pb2.Task:
    """``task`` as the caller sees it: masked outcome as its artifact."""
    outcome = masked_outcome(task) if artifacts and task.state == State.COMPLETED else None
    out = wire.to_task(task, outcome=outcome, history_length=min(max(history_length, 0), HISTORY_MAX))
    if not artifacts:
        del out.artifacts[:]
    return out


def task_result(task: Task, **options: Any) -> dict[str, Any]:
    result: dict[str, Any] = json_format.MessageToDict(task_message(task, **options))
    return result


# --- SendMessage -------------------------------------------------------------------------------


def _digest(message: a2a_pb2.Message) -> str:
    canonical = json.dumps(json_format.MessageToDict(message), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _parts(message: a2a_pb2.Message) -> tuple[list[str], list[Any]]:
    """(texts, data values) of the message's parts; files are refused (we take no files)."""
    texts: list[str] = []
    data: list[Any] = []
    for index, part in enumerate(message.parts):
        kind = part.WhichOneof("content")
        if kind == "text":
            texts.append(part.text)
        elif kind == "data":
            data.append(json_format.MessageToDict(part.data))
        else:
            raise RpcError(
                Code.CONTENT_TYPE_NOT_SUPPORTED,
                "Only text and data parts are taken.",
                {"field": f"message.parts[{index}]"},
            )
    return texts, data


def _earlier(tenant_ids: list[int], message: a2a_pb2.Message, digest: str) -> A2AMessage | None:
    """The record of this ``messageId`` from before: the same content answers its task again."""
    earlier = (
        A2AMessage.objects.select_related("task")
        .filter(tenant_id__in=tenant_ids, message_id=message.message_id)
        .first()
    )
    if earlier is not None and earlier.digest != digest:
        raise RpcError(
            Code.INVALID_PARAMS,
            "This messageId was sent before with other content.",
            {"field": "message.messageId", "task_id": str(earlier.task_id)},
        )
    return earlier


def _tenant(call: Call, slug: str) -> Tenant:
    allowed = tenants_for(call.user, FEED_ROLES)
    if slug:
        tenant = allowed.filter(slug=slug).first()
        if tenant is None:
            raise RpcError(
                Code.INVALID_PARAMS,
                "No tenant of yours by that name lets you start tasks.",
                {"field": "tenant"},
            )
        return tenant
    choices = list(allowed[:2])
    if not choices:
        raise RpcError(
            Code.INVALID_PARAMS,
            "Starting tasks needs the operator, admin or integrator role in a tenant.",
            {"field": "tenant"},
        )
    if len(choices) > 1:
        raise RpcError(
            Code.INVALID_PARAMS,
            "You may start tasks in several tenants: name one in tenant.",
            {"field": "tenant"},
        )
    return choices[0]


def _what_to_start(message: a2a_pb2.Message) -> tuple[str, str, dict[str, Any]]:
    """(task type, objective, input) the message asks for (the module docstring's shape)."""
    texts, data = _parts(message)
    text = "\n".join(t for t in texts if t.strip())
    if len(data) > 1:
        raise RpcError(Code.INVALID_PARAMS, "Give one data part.", {"field": "message.parts"})
    if data:
        body = data[0]
        if not isinstance(body, dict):
            raise RpcError(
                Code.INVALID_PARAMS, "The data part must be an object.", {"field": "message.parts.data"}
            )
        task_type = body.get("task_type", body.get("taskType"))
        given = body.get("input", {})
        objective = body.get("objective", text)
        if not isinstance(task_type, str) or task_type not in registry.names():
            raise RpcError(
                Code.INVALID_PARAMS,
                "data.task_type must name one of the card's skills.",
                {"field": "message.parts.data.task_type", "task_types": sorted(registry.names())},
            )
        if not isinstance(given, dict):
            raise RpcError(
                Code.INVALID_PARAMS, "data.input must be an object.", {"field": "message.parts.data.input"}
            )
        if not isinstance(objective, str):
            raise RpcError(
                Code.INVALID_PARAMS, "data.objective must be text.", {"field": "message.parts.data.objective"}
            )
    else:
        task_type, given, objective = settings.A2A_DEFAULT_TASK_TYPE, {}, text
        if not task_type:
            raise RpcError(
                Code.INVALID_PARAMS,
                'Give a data part {"task_type": …, "input": {…}} (no default task type is set).',
                {"field": "message.parts"},
            )
        if not objective:
            raise RpcError(Code.INVALID_PARAMS, "The message is empty.", {"field": "message.parts"})
    objective = objective.strip() or f"{task_type} started over A2A"
    if len(objective) > MAX_OBJECTIVE:
        raise RpcError(
            Code.INVALID_PARAMS,
            f"The objective is longer than {MAX_OBJECTIVE} characters.",
            {"field": "objective"},
        )
    return task_type, objective, given


def _record(
    call: Call,
    *,
    tenant_id: int,
    message: a2a_pb2.Message,
    kind: str,
    task: Task,
    context_id: str,
    digest: str,
) -> A2AMessage:
    """The (unsaved) idempotency record of ``message``: it commits with what the message did."""
    return A2AMessage(
        tenant_id=tenant_id,
        message_id=message.message_id,
        kind=kind,
        task=task,
        context_id=context_id,
        digest=digest,
        caller=call.user,
        token=call.token,
        user_agent=call.request.headers.get("User-Agent", "")[:300],
    )


def start_task(call: Call, message: a2a_pb2.Message, tenant_slug: str) -> Task:
    """A new task from ``message`` (or the one this messageId started before), in one transaction
    with its ``A2AMessage`` record; the worker's doorbell rings once it commits."""
    tenant = _tenant(call, tenant_slug)
    digest = _digest(message)
    task_type, objective, given = _what_to_start(message)
    try:
        with transaction.atomic():
            earlier = _earlier([tenant.pk], message, digest)
            if earlier is not None:
                return earlier.task
            task, _ = services.task_create(
                tenant=tenant,
                task_type=task_type,
                objective=objective,
                input=given,
                idempotency_key=f"a2a:{message.message_id}",
                owner=call.user,
                api_token=call.token,
                actor=Actor.user(call.user, ActorKind.INTEGRATOR),
                nested=True,
            )
            _record(
                call,
                tenant_id=tenant.pk,
                message=message,
                kind=A2AMessage.Kind.START,
                task=task,
                context_id=message.context_id or str(task.id),
                digest=digest,
            ).save()
            return task
    except services.InvalidTaskInput as exc:
        raise RpcError(
            Code.INVALID_PARAMS,
            "The input does not fit the task type: "
            + "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.errors.items()),
            {"field": "message.parts.data.input", "fields": exc.errors},
        ) from None
    except services.IdempotencyConflict as exc:
        raise RpcError(
            Code.INVALID_PARAMS,
            "This messageId started another task (its idempotency key a2a:<messageId> is taken).",
            {"field": "message.messageId", "task_id": str(exc.task.id)},
        ) from None
    except IntegrityError:  # the same messageId sent twice at once: the first one's record answers
        earlier = _earlier([tenant.pk], message, digest)
        if earlier is None:
            raise
        return earlier.task


def _answer_value(message: a2a_pb2.Message) -> str | int | float | bool:
    texts, data = _parts(message)
    if data:
        body = data[0]
        value = body.get("answer") if isinstance(body, dict) else None
    else:
        value = "\n".join(texts)
    if isinstance(value, str):
        if not value.strip() or len(value) > MAX_ANSWER:
            raise RpcError(
                Code.INVALID_PARAMS,
                f"The answer must be 1 to {MAX_ANSWER} characters.",
                {"field": "message.parts"},
            )
        return value
    if isinstance(value, bool | int | float) and abs(value) <= 2**53:
        return int(value) if isinstance(value, float) and value.is_integer() else value
    raise RpcError(
        Code.INVALID_PARAMS,
        'Answer with a text part, or a data part {"answer": <string, number or boolean>}.',
        {"field": "message.parts"},
    )


def answer_task(call: Call, message: a2a_pb2.Message) -> Task:
    """Answer the ``waiting_input`` of the message's task (or acknowledge this messageId again).

    The answer and its ``A2AMessage`` record commit in one transition (``records=``): a crash
    leaves both or neither, so a retry of the same messageId is either acknowledged or applied."""
    task = visible_task(call, message.task_id, "message.taskId")
    digest = _digest(message)
    earlier = _earlier([task.tenant_id], message, digest)
    if earlier is not None:
        return _acknowledged(earlier, task)
    if not roles_in(call.user, task) & set(FEED_ROLES):
        raise RpcError(Code.TASK_NOT_FOUND, "No such task.", {"field": "message.taskId"})
    answer = _answer_value(message)
    if task.state != State.WAITING_INPUT:
        raise _not_waiting(task)
    record = _record(
        call,
        tenant_id=task.tenant_id,
        message=message,
        kind=A2AMessage.Kind.ANSWER,
        task=task,
        context_id=wire.context_of(task),
        digest=digest,
    )
    try:
        services.task_provide_input(
            task,
            expected_version=task.state_version,
            answer=answer,
            actor=Actor.user(call.user, ActorKind.INTEGRATOR),
            records=[record],
        )
    except (StaleVersion, TransitionNotAllowed):
        earlier = _earlier([task.tenant_id], message, digest)  # the same messageId, answered meanwhile
        if earlier is not None:
            return _acknowledged(earlier, task)
        raise _not_waiting(Task.objects.get(pk=task.pk)) from None
    return Task.objects.select_related("tenant", "owner").get(pk=task.pk)


def _acknowledged(earlier: A2AMessage, task: Task) -> Task:
    if earlier.task_id != task.id:
        raise RpcError(
            Code.INVALID_PARAMS, "This messageId belongs to another task.", {"field": "message.messageId"}
        )
    return Task.objects.select_related("tenant", "owner").get(pk=task.pk)


def _not_waiting(task: Task) -> RpcError:
    return RpcError(
        Code.UNSUPPORTED_OPERATION,
        f"The task is not waiting for input (it is {task.state}).",
        {"field": "message.taskId", "state": task.state, "state_version": task.state_version},
    )


PUSH_FIELD = "configuration.taskPushNotificationConfig."


def keep_push_config(
    call: Call, config: a2a_pb2.TaskPushNotificationConfig, task: Task | None = None, prefix: str = ""
) -> PushConfig | None:
    """With no ``task``: refuse a bad ``config`` before anything is written; with one: keep it for the
    task (``interop.push.configure``). A refusal is invalid params naming ``prefix`` + the field."""
    fields = push.fields_of(config, str(task.id) if task else "task-id")
    try:
        if task is None:
            push.check_config(**fields)
            return None
        return push.configure(task, created_by=call.user, **fields)
    except push.ConfigRefused as refused:
        raise RpcError(Code.INVALID_PARAMS, str(refused), {"field": prefix + refused.field}) from None


def send_message(call: Call) -> tuple[Task, a2a_pb2.SendMessageRequest]:
    """What ``SendMessage`` and ``SendStreamingMessage`` share: the task the message started or answered,
    and the push config of its ``configuration`` kept for that task (checked before anything is written)."""
    request = parse(call.params, a2a_pb2.SendMessageRequest())
    message = request.message
    if not request.HasField("message"):
        raise RpcError(Code.INVALID_PARAMS, "params.message is required.", {"field": "message"})
    if not message.message_id or len(message.message_id) > MAX_MESSAGE_ID:
        raise RpcError(
            Code.INVALID_PARAMS,
            f"message.messageId must be 1 to {MAX_MESSAGE_ID} characters.",
            {"field": "message.messageId"},
        )
    if not message.parts:
        raise RpcError(Code.INVALID_PARAMS, "message.parts is empty.", {"field": "message.parts"})
    pushed = request.configuration.HasField("task_push_notification_config")
    if pushed:
        keep_push_config(call, request.configuration.task_push_notification_config, prefix=PUSH_FIELD)
    task = answer_task(call, message) if message.task_id else start_task(call, message, request.tenant)
    if pushed:
        keep_push_config(call, request.configuration.task_push_notification_config, task, PUSH_FIELD)
    return task, request


@method("SendMessage")
def send_message_method(call: Call) -> dict[str, Any]:
    task, request = send_message(call)
    history = request.configuration.history_length if request.HasField("configuration") else 0
    return {"task": task_result(task, history_length=history)}


# --- GetTask, ListTasks, CancelTask, GetExtendedAgentCard --------------------------------------


@method("GetTask")
def get_task(call: Call) -> dict[str, Any]:
    request = parse(call.params, a2a_pb2.GetTaskRequest())
    return task_result(visible_task(call, request.id), history_length=request.history_length)


@method("ListTasks")
def list_tasks(call: Call) -> dict[str, Any]:
    """The caller's tenants' tasks, newest first, keyset-paged: ``pageToken`` is the last task id of the
    page before (ids are time-ordered UUIDv7). Filters: ``status`` (an A2A state: every state of ours
    that reads as it), ``contextId``."""
    request = parse(call.params, a2a_pb2.ListTasksRequest())
    size = request.page_size or LIST_PAGE_SIZE
    if not 1 <= size <= LIST_PAGE_MAX:
        raise RpcError(Code.INVALID_PARAMS, f"pageSize must be 1 to {LIST_PAGE_MAX}.", {"field": "pageSize"})
    tasks = visibility.visible_tasks(call.user)
    if request.status:
        ours = [state for state, read in READINGS.items() if read.a2a == request.status]
        tasks = tasks.filter(state__in=ours)
    if request.context_id:
        started = Q(a2a_messages__kind=A2AMessage.Kind.START, a2a_messages__context_id=request.context_id)
        try:
            started |= Q(pk=uuid.UUID(request.context_id), a2a_messages__isnull=True)
        except ValueError:
            pass
        tasks = tasks.filter(started)
    total = tasks.count()
    if request.page_token:
        try:
            after = uuid.UUID(request.page_token)
        except ValueError:
            raise RpcError(
                Code.INVALID_PARAMS, "pageToken is not one we gave.", {"field": "pageToken"}
            ) from None
        tasks = tasks.filter(pk__lt=after)
    page = list(tasks.select_related("tenant", "owner").order_by("-id")[: size + 1])
    more, page = len(page) > size, page[:size]
    return {
        "tasks": [
            json_format.MessageToDict(
                task_message(task, history_length=request.history_length, artifacts=request.include_artifacts)
            )
            for task in page
        ],
        "nextPageToken": str(page[-1].id) if more else "",
        "pageSize": size,
        "totalSize": total,
    }


@method("CancelTask")
def cancel_task(call: Call) -> dict[str, Any]:
    """A cancel request through our operator control (``runtime.controls``): the task goes to
    ``cancel_requested`` (reads ``WORKING``) and its worker stops it at the next safe point, then
    ``CANCELED``. Allowed to a caller whose roles allow a cancel (operator, admin: recorded as such),
    and to an integrator for a task it started itself (``controls.started_by``), recorded as the
    integrator kind with the calling client in the reason. Another integrator's task of the same
    tenant, which ``GetTask`` shows the caller, answers ``TaskNotCancelable`` with
    ``data.reason`` ``not_started_by_caller`` (not ``TaskNotFound``: the task is visible to it).
    A finished task: ``TaskNotCancelable``."""
    request = parse(call.params, a2a_pb2.CancelTaskRequest())
    task = visible_task(call, request.id)
    if task.state in TERMINAL:
        raise _not_cancelable(task)
    reason = f"canceled by its A2A caller ({_client(call)})"
    if request.HasField("metadata") and isinstance(
        request.metadata["reason"] if "reason" in request.metadata else None, str
    ):
        reason = f"{reason}: {request.metadata['reason']}"[:2000]
    try:
        controls.task_control(
            task,
            "cancel",
            user=call.user,
            roles=roles_in(call.user, task),
            expected_version=task.state_version,
            reason=reason,
        )
    except StaleVersion:
        raise RpcError(
            Code.TASK_NOT_CANCELABLE,
            "The task changed meanwhile; read it and ask again.",
            {"state": task.state},
        ) from None
    except TransitionNotAllowed:
        current = Task.objects.get(pk=task.pk)
        if current.state in TERMINAL:
            raise _not_cancelable(current) from None
        raise RpcError(
            Code.TASK_NOT_CANCELABLE,
            "Only the caller that started this task, an operator or an admin may cancel it.",
            {"state": current.state, "reason": "not_started_by_caller"},
        ) from None
    return task_result(Task.objects.select_related("tenant", "owner").get(pk=task.pk))


def _client(call: Call) -> str:
    """The calling client as the audit event's reason names it: its API token's name and prefix
    (never the secret; the User-Agent, free text of the caller's choosing, stays on ``A2AMessage``)."""
    if call.token is None:
        return "no token"
    named = f'"{call.token.name}" ' if call.token.name else ""
    return f"token {named}{call.token.prefix}"


def _not_cancelable(task: Task) -> RpcError:
    return RpcError(
        Code.TASK_NOT_CANCELABLE,
        f"The task has ended ({task.state}).",
        {"state": task.state, "state_version": task.state_version},
    )


@method("GetExtendedAgentCard")
def extended_card(call: Call) -> dict[str, Any]:
    """The card for an authenticated caller: the types its tenants may start (every registered type
    today: task types are the deployment's, ``reads.task_types.contracts``)."""
    parse(call.params, a2a_pb2.GetExtendedAgentCardRequest())
    card: dict[str, Any] = json_format.MessageToDict(agent_card(contracts()))
    return card


def events_after(task: Task, version: int) -> list[TransitionEvent]:
    return list(
        TransitionEvent.objects.filter(task=task, state_version__gt=version).order_by("state_version")
    )
