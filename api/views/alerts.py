"""Alerts: ``GET /api/alerts/`` and acknowledging or snoozing one (the JSON twin of ``/console/alerts/``).

Reading needs the operator, admin or auditor role in a tenant (``runtime.alerts.READ_ROLES``;
the list holds those tenants' alerts); acknowledging and snoozing need operator or admin in the
alert's tenant, and a token the ``operate`` scope. Another tenant's alert answers 404.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse
from rest_framework.views import APIView

from api.pagination import NewestFirst
from api.serializers import storable
from runtime import alerts
from runtime.models import Alert, AlertKind, AlertNote
from tenancy.models import Scope, Tenant
from tenancy.selectors import tenant_ids_for

YES_NO_ANY = ["true", "false", "any"]


def _yes_no(value: str) -> bool | None:
    return {"true": True, "false": False}.get(value)


class NoteOutput(serializers.ModelSerializer[AlertNote]):
    class Meta:
        model = AlertNote
        fields = ["kind", "by_name", "at", "note", "snoozed_until"]


class AlertOutput(serializers.ModelSerializer[Alert]):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    open = serializers.SerializerMethodField()
    snoozed = serializers.SerializerMethodField()
    task_url = serializers.SerializerMethodField()
    notes = NoteOutput(many=True, read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "tenant",
            "task",
            "task_url",
            "kind",
            "cause",
            "raised_at",
            "cleared_at",
            "open",
            "state_version",
            "acknowledged_by_name",
            "acknowledged_at",
            "acknowledgement_note",
            "snoozed_until",
            "snoozed",
            "notes",
        ]

    def get_open(self, alert: Alert) -> bool:
        return alert.cleared_at is None

    def get_snoozed(self, alert: Alert) -> bool:
        return alert.snoozed_until is not None and alert.snoozed_until > timezone.now()

    def get_task_url(self, alert: Alert) -> str | None:
        if alert.task_id is None:
            return None
        return reverse("api-task", kwargs={"task_id": alert.task_id}, request=self.context.get("request"))


def _note(value: str) -> str:
    storable(value, "note")
    return value


class AlertListApi(APIView):
    """GET /api/alerts/ — newest first, keyset-paginated; open ones unless ``open=false`` or ``any``."""

    class FilterInput(serializers.Serializer[None]):
        open = serializers.ChoiceField(choices=YES_NO_ANY, required=False, default="true")
        acknowledged = serializers.ChoiceField(choices=YES_NO_ANY, required=False, default="any")
        snoozed = serializers.ChoiceField(choices=YES_NO_ANY, required=False, default="any")
        kind = serializers.ChoiceField(choices=AlertKind.choices, required=False, allow_blank=True)
        task = serializers.UUIDField(required=False)

    @extend_schema(
        operation_id="alerts_list",
        parameters=[
            OpenApiParameter("open", str, enum=YES_NO_ANY, description="Not yet cleared (default true)"),
            OpenApiParameter("acknowledged", str, enum=YES_NO_ANY),
            OpenApiParameter("snoozed", str, enum=YES_NO_ANY, description="Snoozed until a time still ahead"),
            OpenApiParameter("kind", str, enum=AlertKind.values),
            OpenApiParameter("task", str, description="A task's id"),
            OpenApiParameter("cursor", str),
            OpenApiParameter("page_size", int),
        ],
        responses={
            200: AlertOutput(many=True),
            400: OpenApiResponse(description="Bad filter or cursor"),
            403: OpenApiResponse(description="Needs the operator, admin or auditor role in a tenant"),
        },
    )
    def get(self, request: Request) -> Response:
        if not tenant_ids_for(request.user, alerts.READ_ROLES):
            raise PermissionDenied("Alerts need the operator, admin or auditor role in a tenant.")
        filters = self.FilterInput(data=request.query_params)
        if not filters.is_valid():
            raise ValidationError(filters.errors)
        given = filters.validated_data
        found = alerts.filter_alerts(
            alerts.visible_alerts(request.user),
            now=timezone.now(),
            is_open=_yes_no(given["open"]),
            acknowledged=_yes_no(given["acknowledged"]),
            is_snoozed=_yes_no(given["snoozed"]),
            kind=given.get("kind", ""),
            task=given.get("task"),
        )
        pages = NewestFirst()
        page = pages.paginate_queryset(
            found.select_related("tenant").prefetch_related("notes"), request, view=self
        )
        return pages.get_paginated_response(AlertOutput(page, many=True, context={"request": request}).data)


def _handled(request: Request, alert_id: int) -> Alert:
    """The alert (404 outside the caller's tenants), if the caller may act on it (403 otherwise)."""
    alert = alerts.get_alert(request.user, alert_id)
    if not alerts.may_handle(request.user, alert):
        raise PermissionDenied(
            "Acknowledging or snoozing an alert needs the operator or admin role in its tenant."
        )
    return alert


def _refused(exc: alerts.AlertRefused) -> Response:
    body: dict[str, Any] = {exc.field: [str(exc)]} if exc.field else {"detail": str(exc)}
    return Response(body, status=exc.status)


HandledOutput = inline_serializer(
    "AlertHandled", {"alert": AlertOutput(), "applied": serializers.BooleanField()}
)
HANDLE_RESPONSES: dict[int, Any] = {
    200: HandledOutput,
    400: OpenApiResponse(description="Field errors"),
    403: OpenApiResponse(description="Needs the operator or admin role in the alert's tenant"),
    404: OpenApiResponse(description="No such alert in your tenants"),
}


class AlertAcknowledgeApi(APIView):
    """POST /api/alerts/{id}/acknowledge/ — ``note`` required. ``applied: false``: someone had already
    acknowledged it (their acknowledgement stands; this one is kept in ``notes``)."""

    token_scopes = {"POST": Scope.OPERATE}

    class AcknowledgeInput(serializers.Serializer[None]):
        note = serializers.CharField(max_length=alerts.NOTE_MAX, help_text="What you are doing about it")

        def validate_note(self, value: str) -> str:
            return _note(value)

    @extend_schema(operation_id="alerts_acknowledge", request=AcknowledgeInput, responses=HANDLE_RESPONSES)
    def post(self, request: Request, alert_id: int) -> Response:
        alert = _handled(request, alert_id)
        body = self.AcknowledgeInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            alert, first = alerts.acknowledge(alert, user=request.user, note=body.validated_data["note"])
        except alerts.AlertRefused as exc:
            return _refused(exc)
        return Response({"alert": AlertOutput(alert, context={"request": request}).data, "applied": first})


class AlertSnoozeApi(APIView):
    """POST /api/alerts/{id}/snooze/ — ``until`` (ISO 8601, in the future, at most 30 days ahead), optional
    ``note``. 409: the alert was already cleared."""

    token_scopes = {"POST": Scope.OPERATE}

    class SnoozeInput(serializers.Serializer[None]):
        until = serializers.DateTimeField(help_text="Out of the badge until this time")
        note = serializers.CharField(max_length=alerts.NOTE_MAX, required=False, allow_blank=True, default="")

        def validate_note(self, value: str) -> str:
            return _note(value)

    @extend_schema(
        operation_id="alerts_snooze",
        request=SnoozeInput,
        responses={**HANDLE_RESPONSES, 409: OpenApiResponse(description="The alert was cleared")},
    )
    def post(self, request: Request, alert_id: int) -> Response:
        alert = _handled(request, alert_id)
        body = self.SnoozeInput(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            alert = alerts.snooze(alert, user=request.user, **body.validated_data)
        except alerts.AlertRefused as exc:
            return _refused(exc)
        return Response({"alert": AlertOutput(alert, context={"request": request}).data, "applied": True})
