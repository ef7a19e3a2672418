from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def short_id(value) -> str:
    """Last 8 hex digits of an id: task ids are time-ordered UUIDs, so their heads repeat."""
    return str(value).replace("-", "")[-8:]
