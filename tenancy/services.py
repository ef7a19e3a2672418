"""Granting roles. A role is a membership row plus the tenant's group for that
role, which is what object permissions (django-guardian) are granted to."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction

from tenancy.models import AccessEvent, Membership, Role, SavedView, Tenant


def role_group(tenant: Tenant, role: Role | str) -> Group:
    group, _ = Group.objects.get_or_create(name=f"{tenant.slug}:{role}")
    return group


def grant_role(user: Any, tenant: Tenant, role: Role | str) -> Membership:
    membership, _ = Membership.objects.get_or_create(user=user, tenant=tenant, role=role)
    user.groups.add(role_group(tenant, role))
    return membership


def revoke_role(user: Any, tenant: Tenant, role: Role | str) -> None:
    Membership.objects.filter(user=user, tenant=tenant, role=role).delete()
    user.groups.remove(role_group(tenant, role))


# --- saved views (a user's named queue filters) -----------------------------------------------------

SAVED_VIEWS_MAX = 50  # per user


class SavedViewRefused(Exception):
    """The view was not saved; the message says why, in words for the operator."""


def clean_query(query: str, allowed_keys: Iterable[str]) -> str:
    """``query`` reduced to the ``allowed_keys`` (the caller's filter names), empty values dropped.

    The result is re-encoded, so it is safe to append after ``?`` in a link.
    """
    allowed = set(allowed_keys)
    kept = [(key, value.strip()) for key, value in parse_qsl(query[: SavedView.QUERY_MAX * 2])
            if key in allowed and value.strip()]  # fmt: skip
    cleaned = urlencode(kept)
    if len(cleaned) > SavedView.QUERY_MAX:
        raise SavedViewRefused(f"That filter is too long to save (over {SavedView.QUERY_MAX} characters).")
    return cleaned


def saved_view_create(user: Any, *, name: str, query: str, allowed_keys: Iterable[str]) -> SavedView:
    """Save ``query`` (only the ``allowed_keys``) as ``user``'s view ``name``; a name is unique per user."""
    name = " ".join(name.split())
    if not name:
        raise SavedViewRefused("Give the view a name.")
    if len(name) > SavedView.NAME_MAX:
        raise SavedViewRefused(f"A view's name is at most {SavedView.NAME_MAX} characters.")
    cleaned = clean_query(query, allowed_keys)
    with transaction.atomic():
        if SavedView.objects.filter(user_id=user.pk).count() >= SAVED_VIEWS_MAX:
            raise SavedViewRefused(f"You have {SAVED_VIEWS_MAX} saved views already: delete one first.")
        try:
            with transaction.atomic():
                return SavedView.objects.create(user=user, name=name, query=cleaned)
        except IntegrityError:
            raise SavedViewRefused(f"You already have a view named “{name}”.") from None


def saved_view_delete(user: Any, view_id: int) -> bool:
    """Delete ``user``'s view ``view_id``; False if they have no such view (another user's included)."""
    deleted, _ = SavedView.objects.filter(user_id=user.pk, pk=view_id).delete()
    return bool(deleted)


# --- access events (logins, refusals, grants, tokens, reveals) -------------------------------------


def record_access(
    kind: AccessEvent.Kind | str,
    *,
    user: Any = None,
    username: str = "",
    tenant: Tenant | None = None,
    request: Any = None,
    detail: str = "",
) -> AccessEvent:
    """Append one access event. ``request`` (a Django request) supplies the address and path."""
    if user is not None and not getattr(user, "is_authenticated", False):
        user = None
    ip = path = ""
    if request is not None:
        ip = request.META.get("REMOTE_ADDR", "") or ""
        path = request.path[:500]
    return AccessEvent.objects.create(
        kind=kind,
        user=user,
        username=(username or (user.get_username() if user is not None else ""))[:150],
        tenant=tenant,
        ip=ip or None,
        path=path,
        detail=detail[:500],
    )
