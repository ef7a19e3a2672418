"""Roles, saved views, API tokens and the access log.

A role is a membership row plus the tenant's group for that role, which is
what object permissions (django-guardian) are granted to. Every change of
authority (a role granted or revoked, a token created or revoked) is written
to the access log (``record_access``) by the function that makes it.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone

from tenancy.models import AccessEvent, ApiToken, Membership, Role, SavedView, Scope, Tenant
from tenancy.selectors import deletable_views_for


def role_group(tenant: Tenant, role: Role | str) -> Group:
    group, _ = Group.objects.get_or_create(name=f"{tenant.slug}:{role}")
    return group


def _actor(by: Any, request: Any) -> Any:
    """Who is acting: ``by`` if given, else the request's user (None: the system, e.g. seeding)."""
    return by if by is not None else getattr(request, "user", None)


def grant_role(
    user: Any, tenant: Tenant, role: Role | str, *, by: Any = None, request: Any = None
) -> Membership:
    """Give ``user`` ``role`` in ``tenant`` (idempotent); a new grant is recorded as ``role_granted``."""
    with transaction.atomic():
        membership, created = Membership.objects.get_or_create(user=user, tenant=tenant, role=role)
        user.groups.add(role_group(tenant, role))
        if created:
            record_access(
                AccessEvent.Kind.ROLE_GRANTED,
                user=_actor(by, request),
                tenant=tenant,
                request=request,
                detail=f"role={role} user={user.get_username()}",
            )
    return membership


def revoke_role(user: Any, tenant: Tenant, role: Role | str, *, by: Any = None, request: Any = None) -> bool:
    """Take ``role`` in ``tenant`` from ``user``: the membership row and the group.

    Returns whether there was such a role; a revocation is recorded as ``role_revoked``.
    """
    with transaction.atomic():
        deleted, _ = Membership.objects.filter(user=user, tenant=tenant, role=role).delete()
        user.groups.remove(role_group(tenant, role))
        if deleted:
            record_access(
                AccessEvent.Kind.ROLE_REVOKED,
                user=_actor(by, request),
                tenant=tenant,
                request=request,
                detail=f"role={role} user={user.get_username()}",
            )
    return bool(deleted)


def change_role(
    old: Membership, *, user: Any, tenant: Tenant, role: Role | str, by: Any = None, request: Any = None
) -> Membership:
    """Replace the membership ``old`` (as stored) by ``role`` of ``user`` in ``tenant``.

    The old role is revoked, not kept beside the new one: changing an operator to an
    auditor must take the operator's powers away.
    """
    with transaction.atomic():
        if (old.user_id, old.tenant_id, old.role) == (user.pk, tenant.pk, role):
            return old
        revoke_role(old.user, old.tenant, old.role, by=by, request=request)
        return grant_role(user, tenant, role, by=by, request=request)


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


# Who may share a view with a tenant's members, and who may delete a shared one besides its author.
SHARE_ROLES = (Role.OPERATOR, Role.ADMIN)


def saved_view_create(
    user: Any, *, name: str, query: str, allowed_keys: Iterable[str], tenant: Tenant | None = None
) -> SavedView:
    """Save ``query`` (only the ``allowed_keys``) as view ``name``: ``user``'s own, or shared with every
    member of ``tenant`` when given (``user`` must operate or administer it). A name is unique per user
    among personal views, and per tenant among shared ones."""
    name = " ".join(name.split())
    if not name:
        raise SavedViewRefused("Give the view a name.")
    if len(name) > SavedView.NAME_MAX:
        raise SavedViewRefused(f"A view's name is at most {SavedView.NAME_MAX} characters.")
    cleaned = clean_query(query, allowed_keys)
    if (
        tenant is not None
        and not Membership.objects.filter(user_id=user.pk, tenant=tenant, role__in=SHARE_ROLES).exists()
    ):
        raise SavedViewRefused(f"Only the operators and admins of {tenant.slug} share views with it.")
    siblings = (
        SavedView.objects.filter(tenant=tenant)
        if tenant is not None
        else SavedView.objects.filter(user_id=user.pk, tenant=None)
    )
    whose = f"{tenant.slug} has" if tenant is not None else "You have"
    with transaction.atomic():
        if siblings.count() >= SAVED_VIEWS_MAX:
            raise SavedViewRefused(f"{whose} {SAVED_VIEWS_MAX} saved views already: delete one first.")
        try:
            with transaction.atomic():
                return SavedView.objects.create(user=user, tenant=tenant, name=name, query=cleaned)
        except IntegrityError:
            taken = (
                f"{tenant.slug} has a view named “{name}” already"
                if tenant is not None
                else f"You already have a view named “{name}”"
            )
            raise SavedViewRefused(f"{taken}.") from None


def saved_view_delete(user: Any, view_id: int) -> bool:
    """Delete view ``view_id`` if ``user`` may: their own (personal or shared by them), or one shared with
    a tenant they administer. False otherwise (another user's personal view included)."""
    deleted, _ = deletable_views_for(user).filter(pk=view_id).delete()
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
    """Append one access event. ``request`` (a Django or DRF request) supplies the address and path."""
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


# --- API tokens (hashed at rest, scoped, expiring, revocable) ---------------------------------------

TOKEN_BYTES = 32  # 256 bits of randomness: hashing with plain SHA-256 is enough, no slow hash needed
TOUCH_EVERY = timedelta(minutes=1)  # last_used_at is written at most this often per token


class TokenRefused(Exception):
    """The presented key is not a usable token; ``reason`` is unknown, revoked, expired or inactive."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def parse_scopes(text: str | Iterable[str]) -> list[str]:
    """Scopes from ``"read,operate"`` (or an iterable), in a fixed order; ``ValueError`` naming a bad one."""
    names = text.replace(",", " ").split() if isinstance(text, str) else list(text)
    unknown = sorted(set(names) - set(Scope.values))
    if unknown:
        raise ValueError(f"unknown scope {', '.join(unknown)} (scopes: {', '.join(Scope.values)})")
    if not names:
        raise ValueError(f"a token needs at least one scope ({', '.join(Scope.values)})")
    return [scope for scope in Scope.values if scope in names]


def _draw_key() -> str:
    """A fresh URL-safe key that does not start with ``-``, so its prefix is never read as an option."""
    key = secrets.token_urlsafe(TOKEN_BYTES)
    while key.startswith("-"):
        key = secrets.token_urlsafe(TOKEN_BYTES)
    return key


def token_create(
    user: Any,
    *,
    scopes: str | Iterable[str],
    name: str = "",
    expires_at: datetime | None,
    by: Any = None,
    request: Any = None,
) -> tuple[ApiToken, str]:
    """A new token of ``user`` and its key. The key is returned once and never stored.

    Raises ``ValueError`` for unknown or no scopes. Recorded as ``token_created``.
    """
    chosen = parse_scopes(scopes)
    for _ in range(5):  # the prefix is unique: draw again on the (astronomically rare) collision
        key = _draw_key()
        try:
            with transaction.atomic():
                token = ApiToken.objects.create(
                    user=user,
                    name=name[:100],
                    prefix=key[: ApiToken.PREFIX_LENGTH],
                    key_digest=key_digest(key),
                    scopes=" ".join(chosen),
                    expires_at=expires_at,
                )
                _record_token(AccessEvent.Kind.TOKEN_CREATED, token, by=by, request=request)
            return token, key
        except IntegrityError:
            continue
    raise RuntimeError("could not draw a unique token prefix")


def token_revoke(token: ApiToken, *, by: Any = None, request: Any = None) -> bool:
    """Revoke ``token`` now; False if it was revoked already. Recorded as ``token_revoked``."""
    with transaction.atomic():
        revoked = ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
        if revoked:
            token.refresh_from_db(fields=["revoked_at"])
            _record_token(AccessEvent.Kind.TOKEN_REVOKED, token, by=by, request=request)
    return bool(revoked)


def token_refusal(token: ApiToken, now: datetime) -> TokenRefused | None:
    """Why ``token`` (its user loaded) may not be used at ``now``, or None: the one rule of a usable
    token, at authentication and again while a long answer (an A2A stream) is still being sent."""
    if token.revoked_at is not None:
        return TokenRefused("revoked", "Token revoked.")
    if token.expires_at is not None and token.expires_at <= now:
        return TokenRefused("expired", "Token expired.")
    if not token.user.is_active:
        return TokenRefused("inactive", "User inactive or deleted.")
    return None


def token_still_usable(token_id: int) -> bool:
    """Whether the token ``token_id`` still passes ``token_refusal`` (a deleted one does not)."""
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    return token is not None and token_refusal(token, timezone.now()) is None


def token_authenticate(key: str) -> ApiToken:
    """The usable token whose key is ``key`` (its user loaded); ``TokenRefused`` otherwise.

    Touches ``last_used_at`` when it is older than ``TOUCH_EVERY``, so a busy
    integration costs one write a minute, not one per request.
    """
    token = ApiToken.objects.select_related("user").filter(key_digest=key_digest(key)).first()
    if token is None:
        raise TokenRefused("unknown", "Invalid token.")
    now = timezone.now()
    refused = token_refusal(token, now)
    if refused is not None:
        raise refused
    if token.last_used_at is None or now - token.last_used_at >= TOUCH_EVERY:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token


def _record_token(kind: AccessEvent.Kind, token: ApiToken, *, by: Any, request: Any) -> None:
    # Recorded under the token's owner, whose authority it is, so their tenants' auditors see it;
    # who acted, when it was someone else (an admin, a command), is in the detail.
    actor = _actor(by, request)
    acted = ""
    if getattr(actor, "is_authenticated", False) and actor.pk != token.user_id:
        acted = f" by={actor.get_username()}"
    expires = f"{token.expires_at:%Y-%m-%dT%H:%M:%SZ}" if token.expires_at else "never"
    record_access(
        kind,
        user=token.user,
        request=request,
        detail=f"token={token.prefix} name={token.name!r} scopes={token.scopes.replace(' ', ',')} "
        f"expires={expires}{acted}",
    )
