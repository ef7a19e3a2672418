from __future__ import annotations

from uuid import UUID

from django import template

register = template.Library()


@register.filter
def short_id(value: UUID | str) -> str:
    """Last 8 hex digits of an id: task ids are time-ordered UUIDs, so their heads repeat."""
    return str(value).replace("-", "")[-8:]
