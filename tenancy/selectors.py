"""Who may do what, in which tenant. Read-only."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from tenancy.models import Membership, Role, SavedView, Tenant


def roles_by_tenant(user: AbstractBaseUser | AnonymousUser) -> dict[int, frozenset[str]]:
    """Map tenant id -> the roles ``user`` holds there (empty for anonymous)."""
    if not user.is_authenticated:
        return {}
    cached: dict[int, frozenset[str]] | None = getattr(user, "_roles_by_tenant", None)
    if cached is not None:
        return cached
    found: dict[int, set[str]] = {}
    for tenant_id, role in Membership.objects.filter(user_id=user.pk).values_list("tenant_id", "role"):
        found.setdefault(tenant_id, set()).add(role)
    result = {tenant_id: frozenset(roles) for tenant_id, roles in found.items()}
    # One query per request, not per object: cached on the request's user object. The attribute is
    # not a model field, so the stubs do not know it.
    user._roles_by_tenant = result  # type: ignore[attr-defined]
    return result


def tenant_ids_for(user: AbstractBaseUser | AnonymousUser, roles: Iterable[str] | None = None) -> list[int]:
    """Tenants where ``user`` holds any role (or any of ``roles``)."""
    wanted = None if roles is None else set(roles)
    return [tenant_id for tenant_id, held in roles_by_tenant(user).items() if wanted is None or held & wanted]


def tenants_for(
    user: AbstractBaseUser | AnonymousUser, roles: Iterable[str] | None = None
) -> QuerySet[Tenant]:
    return Tenant.objects.filter(id__in=tenant_ids_for(user, roles)).order_by("slug")


def has_role(user: AbstractBaseUser | AnonymousUser, tenant_id: int, *roles: Role | str) -> bool:
    return bool(roles_by_tenant(user).get(tenant_id, frozenset()) & set(roles))


def saved_views_for(user: AbstractBaseUser | AnonymousUser) -> QuerySet[SavedView]:
    """``user``'s saved queue views, by name."""
    if user.pk is None:  # anonymous
        return SavedView.objects.none()
    return SavedView.objects.filter(user_id=user.pk).order_by("name", "id")
