"""Keyset (cursor) pagination for every list the API serves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Field, Model, QuerySet
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import Cursor, CursorPagination
from rest_framework.request import Request
from rest_framework.views import APIView


class Pages(CursorPagination):
    """Keyset pagination: pages stay fast at any depth, and a bad cursor is a 400."""

    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500
    model: type[Model]

    def paginate_queryset(
        self, queryset: QuerySet[Any] | Sequence[Any], request: Request, view: APIView | None = None
    ) -> list[Any] | None:
        assert isinstance(queryset, QuerySet)  # keyset pagination orders and filters a queryset
        self.model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request: Request) -> Cursor | None:
        """A cursor that does not decode, or whose position does not fit the ordering field, is a 400."""
        try:
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                ordering = self.ordering if isinstance(self.ordering, str) else self.ordering[0]
                field = self.model._meta.get_field(ordering.lstrip("-"))
                assert isinstance(field, Field)  # we order by columns, never by a relation
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
