"""Who may do what, in which tenant. Read-only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import F, Q, QuerySet

from tenancy.models import AccessEvent, Membership, Role, SavedView, Tenant

# Who reads the access log of a tenant: its auditors (the separation of duties) and its admins.
ACCESS_LOG_ROLES = (Role.AUDITOR, Role.ADMIN)


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
    """The queue views ``user`` sees: their own, then those shared with a tenant where they hold a role,
    each by name."""
    if user.pk is None:  # anonymous
        return SavedView.objects.none()
    member_of = Membership.objects.filter(user_id=user.pk).values("tenant_id")
    return (
        SavedView.objects.filter(Q(user_id=user.pk, tenant=None) | Q(tenant_id__in=member_of))
        .select_related("tenant", "user")
        .order_by(F("tenant_id").asc(nulls_first=True), "name", "id")
    )


def deletable_views_for(user: AbstractBaseUser | AnonymousUser) -> QuerySet[SavedView]:
    """The views ``user`` may delete: their own (personal, or shared by them), and those shared with a
    tenant they administer."""
    if user.pk is None:
        return SavedView.objects.none()
    administered = Membership.objects.filter(user_id=user.pk, role=Role.ADMIN).values("tenant_id")
    return SavedView.objects.filter(Q(user_id=user.pk) | Q(tenant_id__in=administered))


# --- the access log --------------------------------------------------------------------------------


def visible_access_events(user: AbstractBaseUser | AnonymousUser) -> QuerySet[AccessEvent]:
    """Access events an auditor or admin may read: those of the tenants where they hold that role,
    and those concerning no tenant (logins, failures, refusals, tokens) of the members of those tenants.

    Empty for anyone else; the caller decides whether that is a 403 (see ``ACCESS_LOG_ROLES``).
    """
    tenant_ids = tenant_ids_for(user, ACCESS_LOG_ROLES)
    if not tenant_ids:
        return AccessEvent.objects.none()
    members = Membership.objects.filter(tenant_id__in=tenant_ids).values("user_id")
    return AccessEvent.objects.filter(
        Q(tenant_id__in=tenant_ids) | Q(tenant__isnull=True, user_id__in=members)
    )


def filter_access_events(
    events: QuerySet[AccessEvent], *, kind: str = "", username: str = ""
) -> QuerySet[AccessEvent]:
    """``events`` of one kind and/or by one account (the name as recorded), when given."""
    if kind:
        events = events.filter(kind=kind)
    if username:
        events = events.filter(username=username)
    return events


@dataclass(frozen=True)
class AccessEventPage:
    events: list[AccessEvent]
    next_before: int | None  # the ``before`` of the next (older) page; None: this is the last


def access_events_page(events: QuerySet[AccessEvent], *, before: int | None, limit: int) -> AccessEventPage:
    """One page of ``events``, newest first, strictly older than the event ``before`` (keyset on id:
    ids grow with time, so a page costs the same at any depth)."""
    if before is not None:
        events = events.filter(id__lt=before)
    rows = list(events.select_related("tenant").order_by("-id")[: limit + 1])
    more = len(rows) > limit
    return AccessEventPage(rows[:limit], rows[limit - 1].id if more else None)
