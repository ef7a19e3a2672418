"""REST endpoints for approvals: the inbox and deciding."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.pagination import OldestFirst
from api.serializers import ApprovalDetailOut, ApprovalOut, approval_detail_data
from approvals import selectors, services
from approvals.models import ApprovalStatus, Decision
from tasks import values
from tenancy.models import Scope


def refused(exc: services.ApprovalRefused) -> Response:
    body: dict[str, Any] = {"detail": str(exc), "code": exc.code}
    if exc.request is not None:
        exc.request.refresh_from_db()
        body.update(
            status=exc.request.status,
            task_state=exc.request.task.state,
            state_version=exc.request.task.state_version,
        )
    return Response(body, status=exc.status)


class ApprovalListApi(APIView):
    @extend_schema(
        operation_id="approvals_list",
        parameters=[
            OpenApiParameter("status", str, enum=ApprovalStatus.values),
            OpenApiParameter("task_type", str),
            OpenApiParameter("tenant", str),
            OpenApiParameter("cursor", str),
        ],
        responses={200: ApprovalOut(many=True), 400: OpenApiResponse()},
    )
    def get(self, request: Request) -> Response:
        """``?status=pending`` is the caller's inbox: what they may decide now."""
        if request.query_params.get("status") == ApprovalStatus.PENDING:
            base = selectors.inbox(request.user)
        else:
            base = selectors.visible_requests(request.user).select_related(
                "task", "tenant", "decision__decided_by"
            )
        filters = selectors.ApprovalFilter(request.query_params, queryset=base)
        if not filters.is_valid():
            raise ValidationError(filters.errors)
        pages = OldestFirst()
        page = pages.paginate_queryset(filters.qs, request, view=self)
        return pages.get_paginated_response(ApprovalOut(page, many=True).data)


class ApprovalDetailApi(APIView):
    @extend_schema(
        operation_id="approvals_retrieve", responses={200: ApprovalDetailOut, 404: OpenApiResponse()}
    )
    def get(self, request: Request, request_id: UUID) -> Response:
        """The request with its earlier decisions and who may not decide it (separation of duties)."""
        return Response(approval_detail_data(selectors.get_visible_request(request.user, request_id)))


class ApprovalDecideApi(APIView):
    """POST /api/approvals/{id}/decide/

    200: decided now (``applied: true``), or the same decision was already
    taken (``applied: false``). 409: decided otherwise already, digest differs,
    or the task no longer waits. 410: expired. 403: no authority, or the
    request names the caller as one who caused it (``self_approval``,
    ``decided_before``, ``caused_this_request``: ``approvals.authority``).
    404: not in your tenants.
    """

    token_scopes = {"POST": Scope.APPROVE}

    class DecideInput(serializers.Serializer[None]):
        decision = serializers.ChoiceField(choices=Decision.choices)
        digest = serializers.RegexField(r"^[0-9a-f]{64}$", help_text="The digest shown with the request")
        comment = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")

        def validate_comment(self, value: str) -> str:
            # Kept on the decision and quoted as the audit reason: it must be storable text.
            problem = values.text_problem(value)
            if problem:
                raise serializers.ValidationError(f"comment {problem}")
            return value

    class DecideOutput(serializers.Serializer[None]):
        applied = serializers.BooleanField()
        note = serializers.CharField()
        request = ApprovalDetailOut()

    @extend_schema(
        operation_id="approvals_decide",
        request=DecideInput,
        responses={
            200: DecideOutput,
            400: OpenApiResponse(),
            403: OpenApiResponse(),
            404: OpenApiResponse(),
            409: OpenApiResponse(description="Decided otherwise, digest differs, or task moved on"),
            410: OpenApiResponse(description="Expired"),
        },
    )
    def post(self, request: Request, request_id: UUID) -> Response:
        approval = selectors.get_visible_request(request.user, request_id)
        body = self.DecideInput(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            decided = services.approval_decide(
                approval,
                user=request.user,
                decision=data["decision"],
                digest_seen=data["digest"],
                comment=data["comment"],
            )
        except services.ApprovalRefused as exc:
            return refused(exc)
        fresh = selectors.get_visible_request(request.user, request_id)
        return Response(
            {"applied": decided.applied, "note": decided.note, "request": approval_detail_data(fresh)}
        )
