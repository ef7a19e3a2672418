"""POST /api/tasks/{id}/reveal/ — the clear value of one sensitive field, to those entitled, recorded.

Every other answer shows sensitive fields masked (``protection.reveal``). This one
asks for one field on purpose: operators and admins of the task's tenant only
(403 for auditors and approvers, 404 for another tenant's task), and each
reveal is an access event naming the task, field and version.
"""

from __future__ import annotations

from uuid import UUID

from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.serializers import storable
from protection import reveal
from reads import visibility
from tenancy.models import Scope

MAX_VERSION = 2**31 - 1


class TaskRevealApi(APIView):
    """POST /api/tasks/{id}/reveal/ — one sensitive field in clear (operators and admins; recorded)."""

    token_scopes = {"POST": Scope.OPERATE}

    class RevealInput(serializers.Serializer[None]):
        field = serializers.CharField(max_length=64, help_text="A field the task type marks sensitive")
        state_version = serializers.IntegerField(
            min_value=1,
            max_value=MAX_VERSION,
            required=False,
            help_text="The checkpoint to read it from (default: the task's input, else the newest one)",
        )
        reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

        def validate_field(self, value: str) -> str:
            storable(value, "field")
            return value

        def validate_reason(self, value: str) -> str:
            storable(value, "reason")
            return value

    RevealOutput = inline_serializer(
        "Revealed",
        {
            "task": serializers.UUIDField(),
            "field": serializers.CharField(),
            "value": serializers.JSONField(),
            "source": serializers.ChoiceField(choices=["checkpoint", "input"]),
            "state_version": serializers.IntegerField(allow_null=True),
        },
    )

    @extend_schema(
        operation_id="tasks_reveal",
        request=RevealInput,
        responses={
            200: RevealOutput,
            400: OpenApiResponse(description="Field errors, or a field that is not sensitive"),
            403: OpenApiResponse(description="Needs the operator or admin role in the task's tenant"),
            404: OpenApiResponse(description="No such task, checkpoint version or field"),
            409: OpenApiResponse(description="The checkpoint cannot be read (e.g. its key was retired)"),
        },
    )
    def post(self, request: Request, task_id: UUID) -> Response:
        task = visibility.get_visible_task(request.user, task_id)
        if not reveal.may_reveal(request.user, task):
            raise PermissionDenied(
                "Revealing a sensitive field needs the operator or admin role in this tenant."
            )
        body = self.RevealInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            found = reveal.reveal_field(task, user=request.user, request=request, **body.validated_data)
        except reveal.RevealRefused as exc:
            return Response({"detail": str(exc), "code": exc.code}, status=exc.status)
        response = Response(
            {
                "task": str(task.id),
                "field": found.field,
                "value": found.value,
                "source": found.source,
                "state_version": found.state_version,
            }
        )
        add_never_cache_headers(response)  # a clear value is never kept by a cache on the way
        return response
