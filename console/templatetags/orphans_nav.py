"""Whether the navigation shows the orphan effects link."""

from __future__ import annotations

from django import template

from runtime.alerts import READ_ROLES
from tenancy.selectors import tenant_ids_for

register = template.Library()


@register.simple_tag(takes_context=True)
def reads_orphans(context: template.Context) -> bool:
    """Operators, admins and auditors of some tenant: who the orphans page answers (``console.orphans``)."""
    user = context.get("user")
    return bool(user is not None and user.is_authenticated and tenant_ids_for(user, READ_ROLES))
