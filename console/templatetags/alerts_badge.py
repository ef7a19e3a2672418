"""The navigation's Alerts link and its count of alerts needing attention.

Shown to those who read alerts (operators, admins, auditors of some tenant); the
count is one capped query on the open-alerts partial index (``runtime.alerts.attention_count``).
"""

from __future__ import annotations

from typing import Any

from django import template
from django.urls import reverse

from runtime import alerts
from tenancy.selectors import tenant_ids_for

register = template.Library()


@register.inclusion_tag("console/alerts_badge.html", takes_context=True)
def alerts_nav(context: template.Context) -> dict[str, Any]:
    user = context.get("user")
    if user is None or not user.is_authenticated or not tenant_ids_for(user, alerts.READ_ROLES):
        return {"shown": False}
    count = alerts.attention_count(user)
    return {
        "shown": True,
        "count": min(count, alerts.BADGE_CAP),
        "more": count > alerts.BADGE_CAP,
        # The alerts page has no sub-pages: the link is current on it alone.
        "current": getattr(context.get("request"), "path", "") == reverse("console:alerts"),
    }
