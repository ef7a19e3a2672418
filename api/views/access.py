"""GET /api/access-events/ — the access log (logins, failures, refusals, roles, tokens) for auditors.

The JSON twin of ``/console/access/``: the same scoping (``tenancy.selectors.visible_access_events``),
the same filters, newest first, keyset-paginated.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from api.pagination import NewestFirst
from tenancy.models import AccessEvent, Tenant
from tenancy.selectors import ACCESS_LOG_ROLES, filter_access_events, tenant_ids_for, visible_access_events


class AccessEventListApi(APIView):
    class FilterInput(serializers.Serializer[None]):
        kind = serializers.ChoiceField(choices=AccessEvent.Kind.choices, required=False, allow_blank=True)
        user = serializers.CharField(
            max_length=150, required=False, allow_blank=True, help_text="the account's username"
        )

    class EventOutput(serializers.ModelSerializer[AccessEvent]):
        tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
            slug_field="slug", read_only=True
        )

        class Meta:
            model = AccessEvent
            fields = ["id", "kind", "at", "username", "tenant", "ip", "path", "detail"]

    @extend_schema(
        operation_id="access_events_list",
        parameters=[
            OpenApiParameter("kind", str, enum=AccessEvent.Kind.values),
            OpenApiParameter("user", str, description="Username as recorded"),
            OpenApiParameter("cursor", str),
            OpenApiParameter("page_size", int),
        ],
        responses={
            200: EventOutput(many=True),
            400: OpenApiResponse(description="Bad filter or cursor"),
            403: OpenApiResponse(description="Needs the auditor or admin role in a tenant"),
        },
    )
    def get(self, request: Request) -> Response:
        if not tenant_ids_for(request.user, ACCESS_LOG_ROLES):
            raise PermissionDenied("The access log needs the auditor or admin role in a tenant.")
        filters = self.FilterInput(data=request.query_params)
        if not filters.is_valid():
            raise ValidationError(filters.errors)
        events = filter_access_events(
            visible_access_events(request.user),
            kind=filters.validated_data.get("kind", ""),
            username=filters.validated_data.get("user", ""),
        )
        pages = NewestFirst()
        page = pages.paginate_queryset(events.select_related("tenant"), request, view=self)
        return pages.get_paginated_response(self.EventOutput(page, many=True).data)
