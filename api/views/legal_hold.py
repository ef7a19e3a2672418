"""/api/tasks/{id}/legal-hold/ — a task's retention status, and its legal hold placed or lifted.

GET: whether a hold is in force, every hold the task had, and when retention archived it; any role
of the task's tenant (a token needs ``read``). POST ``{"hold": true|false, "reason": "…"}``: tenant
admins only (403 for every other role, 404 for another tenant's task; a token needs ``operate``).
While a hold is in force retention neither archives nor deletes the task (``protection.holds``).
The hold rows themselves are the record of who placed or lifted one, when and why.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import storable
from protection.holds import set_legal_hold
from reads import visibility
from tasks import selectors
from tasks.exceptions import TaskNotFound
from tasks.models import Archive, LegalHold, Task
from tenancy.models import Role, Scope

HOLDS_SHOWN = 50


class HoldOut(serializers.ModelSerializer[LegalHold]):
    class Meta:
        model = LegalHold
        fields = ["placed_by", "reason", "placed_at", "lifted_by", "lift_reason", "lifted_at"]
        read_only_fields = fields


def _status(task: Task) -> dict[str, Any]:
    holds = list(task.legal_holds.order_by("-placed_at", "-id")[:HOLDS_SHOWN])
    archived = Archive.objects.filter(task=task).values_list("archived_at", flat=True).first()
    return {
        "task": str(task.id),
        "legal_hold": any(hold.lifted_at is None for hold in holds),
        "archived_at": serializers.DateTimeField().to_representation(archived) if archived else None,
        "holds": HoldOut(holds, many=True).data,
    }


STATUS = inline_serializer(
    "RetentionStatus",
    {
        "task": serializers.UUIDField(),
        "legal_hold": serializers.BooleanField(),
        "archived_at": serializers.DateTimeField(allow_null=True),
        "holds": HoldOut(many=True),
    },
)


class TaskLegalHoldApi(APIView):
    """GET: a task's legal holds and archive date. POST: place or lift its hold (tenant admins)."""

    token_scopes = {"POST": Scope.OPERATE}

    class HoldInput(serializers.Serializer[None]):
        hold = serializers.BooleanField(help_text="true places a hold, false lifts the one in force")
        reason = serializers.CharField(max_length=500, help_text="Why (kept with the hold)")

        def validate_reason(self, value: str) -> str:
            storable(value, "reason")
            return value

    @extend_schema(operation_id="tasks_legal_hold_read", responses={200: STATUS, 404: OpenApiResponse()})
    def get(self, request: Request, task_id: UUID) -> Response:
        return Response(_status(visibility.get_visible_task(request.user, task_id)))

    @extend_schema(
        operation_id="tasks_legal_hold",
        request=HoldInput,
        responses={
            200: inline_serializer(
                "LegalHoldChanged", {"changed": serializers.BooleanField(), "status": STATUS}
            ),
            400: OpenApiResponse(description="Field errors"),
            403: OpenApiResponse(description="Needs the admin role in the task's tenant"),
            404: OpenApiResponse(description="No such task (or it was deleted meanwhile)"),
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        if Role.ADMIN not in selectors.roles_in(request.user, task):
            raise PermissionDenied("A legal hold is placed or lifted by an admin of the task's tenant.")
        body = self.HoldInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            changed = set_legal_hold(
                task,
                hold=body.validated_data["hold"],
                by=request.user.get_username(),
                reason=body.validated_data["reason"],
            )
        except TaskNotFound:
            return Response({"detail": "No such task."}, status=status.HTTP_404_NOT_FOUND)
        return Response({"changed": changed, "status": _status(task)})
