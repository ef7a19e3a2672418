"""REST endpoints for tasks. Thin: parse, scope by tenant, call one service, render."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar
from uuid import UUID

from django.db.models import Model, OuterRef, QuerySet, Subquery
from django.shortcuts import get_object_or_404
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.pagination import ByVersion, NewestFirst, OldestFirst, Pages
from api.serializers import (
    ActionOut,
    CheckpointOut,
    DeliveryOut,
    EventOut,
    TaskDetail,
    TaskSummary,
    storable,
    task_detail_data,
)
from audit.models import TransitionEvent
from ledger.models import Action
from reads import queue, visibility
from runtime import controls
from tasks import compensation, registry, services
from tasks.models import Checkpoint, Task
from tasks.selectors import roles_in
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tenancy.models import FEED_ROLES, ApiToken, Role, Scope, Tenant
from tenancy.selectors import tenant_ids_for, tenants_for

MAX_VERSION = 2**31 - 1

CONFLICT = OpenApiResponse(
    inline_serializer(
        "Conflict",
        {
            "detail": serializers.CharField(),
            "code": serializers.CharField(),
            "state": serializers.CharField(allow_null=True),
            "state_version": serializers.IntegerField(allow_null=True),
        },
    ),
    description="Stale expected_version, or no such transition from the current state",
)


# --- start and list ------------------------------------------------------------------------------


def _started(request: Request, start: Callable[[], tuple[Task, bool]]) -> Response:
    """The answer to a call that starts a task (a start, a rerun): 201 with the new task, 200 with the
    one its idempotency key already started; 400 for input the task type refuses; 409 when the key
    started a different task."""
    try:
        task, created = start()
    except services.InvalidTaskInput as exc:
        raise ValidationError({"input": exc.errors}) from None
    except services.IdempotencyConflict as exc:
        return Response(
            {"detail": str(exc), "code": "idempotency_conflict", "task": str(exc.task.id)},
            status=status.HTTP_409_CONFLICT,
        )
    out = task_detail_data(task, request.user)
    return Response(out, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class TaskCollectionApi(APIView):
    token_scopes = {"POST": Scope.INTEGRATE}

    class CreateInput(serializers.Serializer[None]):
        task_type = serializers.ChoiceField(choices=[])
        objective = serializers.CharField(max_length=5000)
        input = serializers.JSONField(default=dict)
        deadline = serializers.DateTimeField(required=False, allow_null=True)
        idempotency_key = serializers.CharField(max_length=200, required=False, allow_blank=False)
        tenant = serializers.SlugField(required=False, help_text="Needed when you may start tasks in several")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            task_type = self.fields["task_type"]
            assert isinstance(task_type, serializers.ChoiceField)
            task_type.choices = registry.names()

        def validate_input(self, value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise serializers.ValidationError("Expected a JSON object.")
            storable(value)
            return value

    @extend_schema(
        operation_id="tasks_list",
        parameters=[
            OpenApiParameter("state", str, enum=State.values, many=True),
            OpenApiParameter("task_type", str, enum=registry.names()),
            OpenApiParameter("tenant", str, description="Tenant slug (one of yours)"),
            OpenApiParameter("stuck", str, enum=["true", "false"], description="No next event coming"),
            OpenApiParameter(
                "q", str, description="Id or id prefix, objective text, idempotency key, input reference"
            ),
            OpenApiParameter("region", str),
            OpenApiParameter("escalated", str, enum=["true", "false"]),
            OpenApiParameter("reason", str, description="Reason code of the state or the outcome"),
            OpenApiParameter("age", str, enum=list(queue.AGES), description="In the state for over"),
            OpenApiParameter("cursor", str),
            OpenApiParameter("page_size", int),
        ],
        responses={200: TaskSummary(many=True), 400: OpenApiResponse(description="Bad filter or cursor")},
    )
    def get(self, request: Request) -> Response:
        filters = queue.TaskFilter(
            request.query_params, queryset=visibility.visible_tasks(request.user), request=request
        )
        if not filters.is_valid():
            raise ValidationError(filters.errors)
        pages = NewestFirst()
        page = pages.paginate_queryset(queue.queue_rows(filters.qs), request, view=self)
        return pages.get_paginated_response(TaskSummary(page, many=True).data)

    @extend_schema(
        operation_id="tasks_create",
        request=CreateInput,
        responses={
            200: OpenApiResponse(TaskDetail, description="Same idempotency key: the task started before"),
            201: TaskDetail,
            400: OpenApiResponse(description="Field errors"),
            403: OpenApiResponse(description="No operator, admin or integrator role in the tenant"),
            409: OpenApiResponse(description="Idempotency key reused with a different request"),
        },
    )
    def post(self, request: Request) -> Response:
        body = self.CreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = self._tenant_for_create(request, data.get("tenant"))
        start = functools.partial(
            services.task_create,
            tenant=tenant,
            task_type=data["task_type"],
            objective=data["objective"],
            input=data["input"],
            deadline=data.get("deadline"),
            idempotency_key=data.get("idempotency_key"),
            owner=request.user,
            api_token=request.auth if isinstance(request.auth, ApiToken) else None,
            actor=Actor.user(request.user, ActorKind.INTEGRATOR),
        )
        return _started(request, start)

    @staticmethod
    def _tenant_for_create(request: Request, slug: str | None) -> Tenant:
        allowed = tenants_for(request.user, FEED_ROLES)
        if slug:
            if not tenant_ids_for(request.user):
                raise PermissionDenied("You belong to no tenant.")
            tenant = allowed.filter(slug=slug).first()
            if tenant is None:
                # A tenant you are not in does not exist, as far as you can tell.
                if not tenants_for(request.user).filter(slug=slug).exists():
                    raise ValidationError({"tenant": ["Unknown tenant."]})
                raise PermissionDenied("Starting tasks needs the operator, admin or integrator role there.")
            return tenant
        choices = list(allowed[:2])
        if not choices:
            raise PermissionDenied("Starting tasks needs the operator, admin or integrator role in a tenant.")
        if len(choices) > 1:
            raise ValidationError({"tenant": ["You may start tasks in several tenants: name one."]})
        return choices[0]


# --- one task and its history --------------------------------------------------------------------


class TaskDetailApi(APIView):
    @extend_schema(operation_id="tasks_retrieve", responses={200: TaskDetail, 404: OpenApiResponse()})
    def get(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        return Response(task_detail_data(task, request.user))


class _TaskHistoryApi(APIView):
    """A paginated history list of one visible task."""

    model: ClassVar[type[Model]] = TransitionEvent
    output: ClassVar[type[serializers.ModelSerializer[Any]]] = EventOut  # rows of ``model``
    pages: ClassVar[type[Pages]] = ByVersion

    def rows(self, task: Task) -> QuerySet[Model]:
        return self.model._default_manager.filter(task=task)

    def get(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        pages = self.pages()
        page = pages.paginate_queryset(self.rows(task), request, view=self)
        return pages.get_paginated_response(self.output(page, many=True, context={"task": task}).data)


@extend_schema_view(
    get=extend_schema(
        operation_id="tasks_events",
        responses={200: EventOut(many=True), 400: OpenApiResponse(), 404: OpenApiResponse()},
        parameters=[OpenApiParameter("cursor", str)],
    )
)
class TaskEventsApi(_TaskHistoryApi):
    pass


@extend_schema_view(
    get=extend_schema(
        operation_id="tasks_checkpoints",
        responses={200: CheckpointOut(many=True), 400: OpenApiResponse(), 404: OpenApiResponse()},
        parameters=[OpenApiParameter("cursor", str)],
    )
)
class TaskCheckpointsApi(_TaskHistoryApi):
    model, output = Checkpoint, CheckpointOut

    def rows(self, task: Task) -> QuerySet[Model]:
        # Each row with the digest its audit event recorded, which decoding checks it against.
        recorded = TransitionEvent.objects.filter(
            task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
        ).values("checkpoint_digest")[:1]
        # django-stubs types annotate() on a queryset of the abstract Model as Any; these are checkpoints.
        checkpoints: QuerySet[Model] = super().rows(task).annotate(recorded_digest=Subquery(recorded))
        return checkpoints


@extend_schema_view(
    get=extend_schema(
        operation_id="tasks_actions",
        responses={200: ActionOut(many=True), 400: OpenApiResponse(), 404: OpenApiResponse()},
        parameters=[OpenApiParameter("cursor", str)],
    )
)
class TaskActionsApi(_TaskHistoryApi):
    model, output, pages = Action, ActionOut, OldestFirst


# --- operator controls ---------------------------------------------------------------------------


class _ControlSchema(AutoSchema):
    """One view class serves every control; each control's operation is named after it."""

    def get_operation_id(self) -> str:
        view = self.view
        assert isinstance(view, TaskControlApi)
        return f"tasks_{view.control}"


class TaskControlApi(APIView):
    """POST /api/tasks/{id}/{cancel,quarantine,release,retry,escalate,reconcile}/"""

    # One URL per control, named through as_view (``TaskControlApi.as_view(control="cancel")``);
    # one of ``runtime.controls.CONTROLS``. (The docstring above is the schema's description.)
    control: str = ""
    schema = _ControlSchema()
    token_scopes = {"POST": Scope.OPERATE}

    class ControlInput(serializers.Serializer[None]):
        expected_version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION)
        reason = serializers.CharField(max_length=2000)
        scope = serializers.ChoiceField(choices=controls.CANCEL_SCOPES, default="task")
        escalate_to = serializers.ChoiceField(choices=controls.ESCALATION_ROLES, default="admin")

        def validate_reason(self, value: str) -> str:
            storable(value, "reason")
            return value

    class ControlOutput(serializers.Serializer[None]):
        applied = serializers.BooleanField()
        note = serializers.CharField()
        task = TaskDetail()

    @extend_schema(
        request=ControlInput,
        responses={
            200: ControlOutput,
            400: OpenApiResponse(description="Field errors"),
            403: OpenApiResponse(description="Your roles do not allow this control"),
            404: OpenApiResponse(),
            409: CONFLICT,
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        roles = roles_in(request.user, task)
        if not roles & {Role.OPERATOR, Role.ADMIN}:
            raise PermissionDenied("Operator controls need the operator or admin role in this tenant.")
        body = self.ControlInput(data=request.data)
        body.is_valid(raise_exception=True)
        result = controls.task_control(
            task, self.control, user=request.user, roles=roles, **body.validated_data
        )
        task = get_object_or_404(Task.objects.select_related("tenant", "owner"), pk=result.task.pk)
        return Response(
            {
                "applied": result.applied,
                "note": result.note,
                "task": task_detail_data(task, request.user),
            }
        )


class TaskRerunApi(APIView):
    """POST /api/tasks/{id}/rerun/ — start a new task that reruns a failed, expired or canceled one."""

    token_scopes = {"POST": Scope.OPERATE}

    class RerunInput(serializers.Serializer[None]):
        reason = serializers.CharField(max_length=2000)
        idempotency_key = serializers.CharField(max_length=200, required=False, allow_blank=False)
        deadline = serializers.DateTimeField(required=False, allow_null=True)

        def validate_reason(self, value: str) -> str:
            storable(value, "reason")
            return value

        def validate_idempotency_key(self, value: str) -> str:
            storable(value, "idempotency_key")
            return value

    @extend_schema(
        operation_id="tasks_rerun",
        request=RerunInput,
        responses={
            200: OpenApiResponse(TaskDetail, description="Same idempotency key: the rerun started before"),
            201: TaskDetail,
            400: OpenApiResponse(description="Field errors (also: the old input no longer fits the type)"),
            403: OpenApiResponse(description="Needs the operator or admin role in the task's tenant"),
            404: OpenApiResponse(),
            409: CONFLICT,
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        if not roles_in(request.user, task) & {Role.OPERATOR, Role.ADMIN}:
            raise PermissionDenied("Rerunning a task needs the operator or admin role in its tenant.")
        body = self.RerunInput(data=request.data)
        body.is_valid(raise_exception=True)
        actor = Actor.user(request.user, ActorKind.OPERATOR)
        return _started(
            request, functools.partial(services.task_rerun, task, actor=actor, **body.validated_data)
        )


class TaskCompensateApi(APIView):
    """POST /api/tasks/{id}/compensate/ — undo an effect a canceled task left done (tasks.compensation)."""

    token_scopes = {"POST": Scope.OPERATE}

    class CompensateInput(serializers.Serializer[None]):
        action = serializers.CharField(
            max_length=200, help_text="The effect's idempotency key, from the report"
        )
        reason = serializers.CharField(max_length=2000)

        def validate_reason(self, value: str) -> str:
            storable(value, "reason")
            return value

    @extend_schema(
        operation_id="tasks_compensate",
        request=CompensateInput,
        responses={
            200: OpenApiResponse(TaskDetail, description="That effect's run under way or completed"),
            201: OpenApiResponse(TaskDetail, description="The compensation run, a new task"),
            400: OpenApiResponse(
                description="Field errors (also: the old input or checkpoint cannot be read)"
            ),
            403: OpenApiResponse(description="Needs the operator or admin role in the task's tenant"),
            404: OpenApiResponse(),
            409: OpenApiResponse(
                description="not_compensable: the task is not canceled, the effect is not offered, "
                "or its undo is done or in doubt"
            ),
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        if not roles_in(request.user, task) & {Role.OPERATOR, Role.ADMIN}:
            raise PermissionDenied(
                "Compensating an effect needs the operator or admin role in the task's tenant."
            )
        body = self.CompensateInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run, created = compensation.start(
                task, body.validated_data["action"], user=request.user, reason=body.validated_data["reason"]
            )
        except services.InvalidTaskInput as exc:
            raise ValidationError(exc.errors) from None
        out = task_detail_data(run, request.user)
        return Response(out, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


# --- input and events from outside ---------------------------------------------------------------

FEED_RESPONSES = {
    200: DeliveryOut,
    400: OpenApiResponse(description="Field errors"),
    403: OpenApiResponse(description="Needs the operator, admin or integrator role in the task's tenant"),
    404: OpenApiResponse(),
    409: CONFLICT,
}


def _delivery_response(request: Request, delivery: services.Delivery) -> Response:
    task = Task.objects.select_related("tenant", "owner").get(pk=delivery.task.pk)
    body = {
        "applied": delivery.applied,
        "note": delivery.note,
        "task": task_detail_data(task, request.user),
    }
    return Response(body, status=status.HTTP_200_OK)


def _integrator(request: Request, task: Task) -> Actor:
    """Feeding a task input and events needs the operator, admin or integrator role in its tenant."""
    if not roles_in(request.user, task) & set(FEED_ROLES):
        raise PermissionDenied("Feeding a task needs the operator, admin or integrator role in its tenant.")
    return Actor.user(request.user, ActorKind.INTEGRATOR)


class _FeedApi(APIView, ABC):
    """What feeding a task from outside shares: the task in the caller's tenants, the feeding role, the
    body validated by ``Body``, one service call (``deliver``), and the delivery with the task after."""

    token_scopes = {"POST": Scope.INTEGRATE}
    Body: ClassVar[type[serializers.Serializer[None]]]

    @abstractmethod
    def deliver(self, task: Task, actor: Actor, data: dict[str, Any]) -> services.Delivery: ...

    # No docstring here: drf-spectacular would make it every subclass's operation description.
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        actor = _integrator(request, task)
        body = self.Body(data=request.data)
        body.is_valid(raise_exception=True)
        return _delivery_response(request, self.deliver(task, actor, body.validated_data))


class AnswerInput(serializers.Serializer[None]):
    expected_version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION)
    payload = serializers.JSONField(help_text='{"answer": <string, number or boolean>}')

    def validate_payload(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or "answer" not in value:
            raise serializers.ValidationError('Expected an object with an "answer".')
        answer = value["answer"]
        if not isinstance(answer, str | int | float | bool) or (
            isinstance(answer, str) and len(answer) > 2000
        ):
            raise serializers.ValidationError(
                "answer must be a string (up to 2000 characters), number or boolean."
            )
        if isinstance(answer, int) and not isinstance(answer, bool) and abs(answer) > 2**53:
            raise serializers.ValidationError("answer is too large a number.")
        storable(value, "payload")
        return value


class EventInput(serializers.Serializer[None]):
    event_key = serializers.CharField(max_length=200)
    event_type = serializers.CharField(max_length=100)
    payload = serializers.JSONField(default=dict)

    def validate_payload(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Expected a JSON object.")
        storable(value, "payload")
        return value


@extend_schema_view(
    post=extend_schema(operation_id="tasks_input", request=AnswerInput, responses=FEED_RESPONSES)
)
class TaskInputApi(_FeedApi):
    """POST /api/tasks/{id}/input/ — answer a task waiting for input."""

    Body = AnswerInput

    def deliver(self, task: Task, actor: Actor, data: dict[str, Any]) -> services.Delivery:
        return services.task_provide_input(
            task, expected_version=data["expected_version"], answer=data["payload"]["answer"], actor=actor
        )


@extend_schema_view(
    post=extend_schema(operation_id="tasks_external_events", request=EventInput, responses=FEED_RESPONSES)
)
class TaskExternalEventApi(_FeedApi):
    """POST /api/tasks/{id}/external-events/ — deliver an event; ``event_key`` dedupes.

    A repeated ``event_key`` answers 200 ``applied: false`` (also once the task
    ended). A new key is a 409 with the task's state when the task has ended
    (``task_ended``) or already holds ``EXTERNAL_EVENTS_MAX_PER_TASK`` events
    (``too_many_events``): retrying it will not help, so not a 429.
    """

    Body = EventInput

    def deliver(self, task: Task, actor: Actor, data: dict[str, Any]) -> services.Delivery:
        return services.task_deliver_event(task, actor=actor, **data)
