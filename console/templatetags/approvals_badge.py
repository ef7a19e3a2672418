"""The navigation's count of approvals waiting for the signed-in user."""

from __future__ import annotations

from typing import Any

from django import template

from approvals import selectors
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for

register = template.Library()


@register.inclusion_tag("console/pending_badge.html", takes_context=True)
def pending_badge(context: template.Context) -> dict[str, Any]:
    """One capped COUNT, and only for people who can decide (an approver somewhere)."""
    user = context.get("user")
    if user is None or not user.is_authenticated or not tenant_ids_for(user, [Role.APPROVER]):
        return {"count": None}
    count = selectors.pending_count(user)
    return {"count": min(count, selectors.BADGE_CAP), "more": count > selectors.BADGE_CAP}
