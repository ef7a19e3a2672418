"""Whether the navigation shows the access log link."""

from __future__ import annotations

from django import template

from tenancy.selectors import ACCESS_LOG_ROLES, tenant_ids_for

register = template.Library()


@register.simple_tag(takes_context=True)
def reads_access_log(context: template.Context) -> bool:
    """Auditors and admins of some tenant (the roles are read once per request, cached on the user)."""
    user = context.get("user")
    return bool(user is not None and user.is_authenticated and tenant_ids_for(user, ACCESS_LOG_ROLES))
