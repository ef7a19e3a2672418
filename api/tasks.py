"""REST endpoints for tasks. Thin: parse, scope by tenant, call one service, render."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import OuterRef, QuerySet, Subquery
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS
from audit.models import LeaseTakeover, TransitionEvent
from ledger.models import Action
from runtime import controls
from tasks import checkpoints, registry, selectors, services, values
from tasks.models import Checkpoint, Lease, Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for, tenants_for

MAX_VERSION = 2**31 - 1
TAKEOVERS_SHOWN = 5  # newest lease takeovers in a task's detail
CREATE_ROLES = (Role.OPERATOR, Role.ADMIN)


def _storable(value: Any, where: str = "input") -> None:
    """A value PostgreSQL cannot hold (NUL, lone surrogate, NaN, in a key or a value) is bad
    input: a 400 naming where it sits, never a 500 from the database (``tasks.values``)."""
    try:
        values.check(value, where)
    except values.Unstorable as exc:
        raise serializers.ValidationError(str(exc)) from None


class Pages(CursorPagination):
    """Keyset pagination: pages stay fast at any depth, and a bad cursor is a 400."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def paginate_queryset(self, queryset, request, view=None):
        self.model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        """A cursor that does not decode, or whose position does not fit the ordering field, is a 400."""
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                ordering = self.ordering if isinstance(self.ordering, str) else self.ordering[0]
                field = self.model._meta.get_field(ordering.lstrip("-"))
                field.get_prep_value(field.to_python(cursor.position))
            return cursor
        except (NotFound, DjangoValidationError, ValueError, TypeError):
            raise ValidationError({"cursor": ["Invalid cursor."]}) from None


class NewestFirst(Pages):
    ordering = "-id"  # ids are time-ordered UUIDs


class ByVersion(Pages):
    ordering = "state_version"


class OldestFirst(Pages):
    ordering = "id"


class TaskSummary(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Task
        fields = [
            "id",
            "tenant",
            "task_type",
            "objective",
            "state",
            "state_version",
            "state_reason",
            "region",
            "attempt",
            "escalation_level",
            "deadline",
            "wait_deadline",
            "created_at",
            "updated_at",
            "state_entered_at",
        ]
        read_only_fields = fields


class TaskDetail(TaskSummary):
    owner = serializers.SlugRelatedField(slug_field="username", read_only=True)
    runtime_config = serializers.SerializerMethodField()
    escalation = serializers.SerializerMethodField()
    lease = serializers.SerializerMethodField()
    pending_approvals = serializers.SerializerMethodField()
    ledger = serializers.SerializerMethodField()
    allowed_transitions = serializers.SerializerMethodField()

    class Meta(TaskSummary.Meta):
        fields = TaskSummary.Meta.fields + [
            "owner",
            "parent",
            "input",
            "outcome",
            "idempotency_key",
            "policy_version",
            "runtime_config",
            "escalation",
            "lease",
            "pending_approvals",
            "ledger",
            "allowed_transitions",
        ]
        read_only_fields = fields

    def get_runtime_config(self, task: Task) -> dict[str, str]:
        return {"model": task.model_id, "prompt": task.prompt_id, "tool_set": task.toolset_id}

    def get_escalation(self, task: Task) -> dict[str, Any]:
        return {"level": task.escalation_level, "to": task.escalated_to, "reason": task.escalation_reason}

    def get_lease(self, task: Task) -> dict[str, Any] | None:
        lease = Lease.objects.filter(task=task).first()
        if lease is None:
            return None
        takeovers = LeaseTakeover.objects.filter(task=task).order_by("-taken_at")[:TAKEOVERS_SHOWN]
        return {
            "worker_id": lease.worker_id,
            "token": lease.token,
            "heartbeat_at": lease.heartbeat_at,
            "expires_at": lease.expires_at,
            "live": lease.expires_at > timezone.now(),
            # Newest first: leases reclaimed from workers that stopped heartbeating.
            "takeovers": [
                {
                    "worker_id": t.worker_id,
                    "token": t.token,
                    "previous_worker_id": t.previous_worker_id,
                    "stale_token": t.stale_token,
                    "previous_heartbeat_at": t.previous_heartbeat_at,
                    "previous_expires_at": t.previous_expires_at,
                    "taken_at": t.taken_at,
                    "heartbeat_age_seconds": (t.taken_at - t.previous_heartbeat_at).total_seconds(),
                }
                for t in takeovers
            ],
        }

    def get_pending_approvals(self, task: Task) -> list[dict[str, Any]]:
        if task.state != State.WAITING_APPROVAL:
            return []  # a request the task no longer waits for is not pending, whatever its row says yet
        pending = ApprovalRequest.objects.filter(
            task=task, status=ApprovalStatus.PENDING, waiting_version=task.state_version
        ).order_by("created_at")
        return [
            {
                "id": r.id,
                "step": r.step,
                "action_step": r.action_step,
                "digest": r.digest,
                "expires_at": r.expires_at,
            }
            for r in pending
        ]

    def get_ledger(self, task: Task) -> dict[str, int]:
        return selectors.ledger_summary(task)

    def get_allowed_transitions(self, task: Task) -> list[dict[str, str]]:
        return selectors.allowed_moves(self.context["request"].user, task)


class EventOut(serializers.ModelSerializer):
    class Meta:
        model = TransitionEvent
        # Every hashed field (so an auditor can recompute the chain), bar the task's own ids.
        fields = [name for name in HASHED_FIELDS if name not in ("task_id", "tenant_id")] + [
            *OPTIONAL_HASHED_FIELDS,
            "prev_hash",
            "hash",
        ]
        read_only_fields = fields


class CheckpointOut(serializers.ModelSerializer):
    document = serializers.SerializerMethodField()
    readable = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["state_version", "schema_version", "codec", "digest", "created_at", "readable", "document"]
        read_only_fields = fields

    def _decoded(self, row: Checkpoint) -> dict[str, Any]:
        cache = self.__dict__.setdefault("_decoded_rows", {})
        if row.pk not in cache:
            try:
                # recorded_digest: annotated by TaskCheckpointsApi from the row's audit event.
                document = checkpoints.decode_stored(row, recorded_digest=row.recorded_digest)
                document = document.model_dump(mode="json")
                cache[row.pk] = {"ok": True, "document": document}
            except checkpoints.CheckpointUnreadable as exc:
                cache[row.pk] = {"ok": False, "document": {"reason": exc.reason, "detail": exc.detail}}
        return cache[row.pk]

    def get_readable(self, row: Checkpoint) -> bool:
        return self._decoded(row)["ok"]

    def get_document(self, row: Checkpoint) -> dict[str, Any]:
        return self._decoded(row)["document"]


class ActionOut(serializers.ModelSerializer):
    class Meta:
        model = Action
        fields = [
            "id",
            "step",
            "idempotency_key",
            "connector",
            "effect",
            "effect_digest",
            "dispatch_state",
            "outcome",
            "external_ref",
            "attempts",
            "last_error",
            "duplicates_suppressed",
            "dispatched_at",
            "unknown_since",
            "checked_at",
            "resolved_at",
            "compensation_of",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


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


class TaskCollectionApi(APIView):
    class CreateInput(serializers.Serializer):
        task_type = serializers.ChoiceField(choices=[])
        objective = serializers.CharField(max_length=5000)
        input = serializers.JSONField(default=dict)
        deadline = serializers.DateTimeField(required=False, allow_null=True)
        idempotency_key = serializers.CharField(max_length=200, required=False, allow_blank=False)
        tenant = serializers.SlugField(required=False, help_text="Needed when you may start tasks in several")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.fields["task_type"].choices = registry.names()

        def validate_input(self, value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise serializers.ValidationError("Expected a JSON object.")
            _storable(value)
            return value

    @extend_schema(
        operation_id="tasks_list",
        parameters=[
            OpenApiParameter("state", str, enum=State.values, many=True),
            OpenApiParameter("task_type", str, enum=registry.names()),
            OpenApiParameter("tenant", str),
            OpenApiParameter("stuck", str, enum=["true", "false"], description="No next event coming"),
            OpenApiParameter("cursor", str),
            OpenApiParameter("page_size", int),
        ],
        responses={200: TaskSummary(many=True), 400: OpenApiResponse(description="Bad filter or cursor")},
    )
    def get(self, request: Request) -> Response:
        filters = selectors.TaskFilter(request.query_params, queryset=selectors.visible_tasks(request.user))
        if not filters.is_valid():
            raise ValidationError(filters.errors)
        pages = NewestFirst()
        page = pages.paginate_queryset(filters.qs.select_related("tenant"), request, view=self)
        return pages.get_paginated_response(TaskSummary(page, many=True).data)

    @extend_schema(
        operation_id="tasks_create",
        request=CreateInput,
        responses={
            200: OpenApiResponse(TaskDetail, description="Same idempotency key: the task started before"),
            201: TaskDetail,
            400: OpenApiResponse(description="Field errors"),
            403: OpenApiResponse(description="No operator or admin role in the tenant"),
            409: OpenApiResponse(description="Idempotency key reused with a different request"),
        },
    )
    def post(self, request: Request) -> Response:
        body = self.CreateInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        tenant = self._tenant_for_create(request, data.get("tenant"))
        try:
            task, created = services.task_create(
                tenant=tenant,
                task_type=data["task_type"],
                objective=data["objective"],
                input=data["input"],
                deadline=data.get("deadline"),
                idempotency_key=data.get("idempotency_key"),
                owner=request.user,
                actor=Actor.user(request.user, ActorKind.INTEGRATOR),
            )
        except services.InvalidTaskInput as exc:
            raise ValidationError({"input": exc.errors}) from None
        except services.IdempotencyConflict as exc:
            return Response(
                {"detail": str(exc), "code": "idempotency_conflict", "task": str(exc.task.id)},
                status=status.HTTP_409_CONFLICT,
            )
        out = TaskDetail(task, context={"request": request}).data
        return Response(out, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @staticmethod
    def _tenant_for_create(request: Request, slug: str | None):
        allowed = tenants_for(request.user, CREATE_ROLES)
        if slug:
            if not tenant_ids_for(request.user):
                raise PermissionDenied("You belong to no tenant.")
            tenant = allowed.filter(slug=slug).first()
            if tenant is None:
                # A tenant you are not in does not exist, as far as you can tell.
                if not tenants_for(request.user).filter(slug=slug).exists():
                    raise ValidationError({"tenant": ["Unknown tenant."]})
                raise PermissionDenied("Starting tasks needs the operator or admin role in that tenant.")
            return tenant
        choices = list(allowed[:2])
        if not choices:
            raise PermissionDenied("Starting tasks needs the operator or admin role in a tenant.")
        if len(choices) > 1:
            raise ValidationError({"tenant": ["You may start tasks in several tenants: name one."]})
        return choices[0]


class TaskDetailApi(APIView):
    @extend_schema(operation_id="tasks_retrieve", responses={200: TaskDetail, 404: OpenApiResponse()})
    def get(self, request: Request, task_id) -> Response:
        task = selectors.get_visible_task(request.user, task_id)
        return Response(TaskDetail(task, context={"request": request}).data)


class _TaskHistoryApi(APIView):
    """A paginated history list of one visible task."""

    model: type = TransitionEvent
    output: type[serializers.Serializer] = EventOut
    pages: type[Pages] = ByVersion

    def rows(self, task: Task) -> QuerySet:
        return self.model.objects.filter(task=task)

    def get(self, request: Request, task_id) -> Response:
        task = selectors.get_visible_task(request.user, task_id)
        pages = self.pages()
        page = pages.paginate_queryset(self.rows(task), request, view=self)
        return pages.get_paginated_response(self.output(page, many=True).data)


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

    def rows(self, task: Task) -> QuerySet:
        # Each row with the digest its audit event recorded, which decoding checks it against.
        recorded = TransitionEvent.objects.filter(
            task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
        ).values("checkpoint_digest")[:1]
        return super().rows(task).annotate(recorded_digest=Subquery(recorded))


@extend_schema_view(
    get=extend_schema(
        operation_id="tasks_actions",
        responses={200: ActionOut(many=True), 400: OpenApiResponse(), 404: OpenApiResponse()},
        parameters=[OpenApiParameter("cursor", str)],
    )
)
class TaskActionsApi(_TaskHistoryApi):
    model, output, pages = Action, ActionOut, OldestFirst


class TaskControlApi(APIView):
    """POST /api/tasks/{id}/{cancel,quarantine,release,retry,escalate,reconcile}/"""

    control = ""

    class ControlInput(serializers.Serializer):
        expected_version = serializers.IntegerField(min_value=1, max_value=MAX_VERSION)
        reason = serializers.CharField(max_length=2000)
        scope = serializers.ChoiceField(choices=controls.CANCEL_SCOPES, default="task")
        escalate_to = serializers.ChoiceField(choices=controls.ESCALATION_ROLES, default="admin")

        def validate_reason(self, value: str) -> str:
            _storable(value, "reason")
            return value

    class ControlOutput(serializers.Serializer):
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
    def post(self, request: Request, task_id) -> Response:
        task = selectors.get_visible_task(request.user, task_id)
        roles = selectors.roles_in(request.user, task)
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
                "task": TaskDetail(task, context={"request": request}).data,
            }
        )


def control_view(name: str):
    return extend_schema_view(post=extend_schema(operation_id=f"tasks_{name}"))(
        type(f"Task{name.title()}Api", (TaskControlApi,), {"control": name})
    ).as_view()


class DeliveryOut(serializers.Serializer):
    applied = serializers.BooleanField(help_text="False: a duplicate, acknowledged and not applied again")
    note = serializers.CharField()
    task = TaskDetail()


FEED_RESPONSES = {
    200: DeliveryOut,
    400: OpenApiResponse(description="Field errors"),
    403: OpenApiResponse(description="Needs the operator or admin role in the task's tenant"),
    404: OpenApiResponse(),
    409: CONFLICT,
}


def _delivery_response(request: Request, delivery: services.Delivery) -> Response:
    task = Task.objects.select_related("tenant", "owner").get(pk=delivery.task.pk)
    body = {
        "applied": delivery.applied,
        "note": delivery.note,
        "task": TaskDetail(task, context={"request": request}).data,
    }
    return Response(body, status=status.HTTP_200_OK)


def _integrator(request: Request, task: Task) -> Actor:
    """Feeding a task input and events needs the operator or admin role in its tenant."""
    if not selectors.roles_in(request.user, task) & {Role.OPERATOR, Role.ADMIN}:
        raise PermissionDenied("Feeding a task needs the operator or admin role in its tenant.")
    return Actor.user(request.user, ActorKind.INTEGRATOR)


class TaskInputApi(APIView):
    """POST /api/tasks/{id}/input/ — answer a task waiting for input."""

    class AnswerInput(serializers.Serializer):
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
            _storable(value, "payload")
            return value

    @extend_schema(
        operation_id="tasks_input",
        request=AnswerInput,
        responses=FEED_RESPONSES,
    )
    def post(self, request: Request, task_id) -> Response:
        task = selectors.get_visible_task(request.user, task_id)
        actor = _integrator(request, task)
        body = self.AnswerInput(data=request.data)
        body.is_valid(raise_exception=True)
        delivery = services.task_provide_input(
            task,
            expected_version=body.validated_data["expected_version"],
            answer=body.validated_data["payload"]["answer"],
            actor=actor,
        )
        return _delivery_response(request, delivery)


class TaskExternalEventApi(APIView):
    """POST /api/tasks/{id}/external-events/ — deliver an event; ``event_key`` dedupes."""

    class EventInput(serializers.Serializer):
        event_key = serializers.CharField(max_length=200)
        event_type = serializers.CharField(max_length=100)
        payload = serializers.JSONField(default=dict)

        def validate_payload(self, value: Any) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise serializers.ValidationError("Expected a JSON object.")
            _storable(value, "payload")
            return value

    @extend_schema(
        operation_id="tasks_external_events",
        request=EventInput,
        responses=FEED_RESPONSES,
    )
    def post(self, request: Request, task_id) -> Response:
        task = selectors.get_visible_task(request.user, task_id)
        actor = _integrator(request, task)
        body = self.EventInput(data=request.data)
        body.is_valid(raise_exception=True)
        delivery = services.task_deliver_event(task, actor=actor, **body.validated_data)
        return _delivery_response(request, delivery)
