"""Tenants and per-tenant roles.

Every task belongs to one tenant, and every read or write the API and the
console make is scoped to the tenants the caller holds a membership in.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q


class Role(models.TextChoices):
    OPERATOR = "operator"
    APPROVER = "approver"
    AUDITOR = "auditor"
    ADMIN = "admin"
    # A system, not a person: starts tasks, answers them and delivers their external events,
    # reads its tenant's tasks; no operator controls, no approvals.
    INTEGRATOR = "integrator"


# Who may start tasks, answer their questions and deliver their events in a tenant, over any surface
# (the REST API, A2A).
FEED_ROLES = (Role.OPERATOR, Role.ADMIN, Role.INTEGRATOR)


class Tenant(models.Model):
    slug = models.SlugField(unique=True)
    name = models.CharField(max_length=200)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    """One role of one user in one tenant; a user may hold several roles."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant", "role"], name="membership_unique_role"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.role}@{self.tenant}"


class SavedView(models.Model):
    """A named queue filter: the query string the queue page was showing.

    Personal (``tenant`` unset): its ``user``'s alone. Shared (``tenant`` set): every member of that
    tenant sees it, ``user`` being who shared it. A name is unique among a user's personal views and
    among a tenant's shared ones. The filter reads only what each viewer may see anyway.
    """

    NAME_MAX = 80
    QUERY_MAX = 1000

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="shared_views"
    )
    name = models.CharField(max_length=NAME_MAX)
    query = models.CharField(max_length=QUERY_MAX, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"], condition=Q(tenant__isnull=True), name="savedview_unique_name"
            ),
            models.UniqueConstraint(
                fields=["tenant", "name"],
                condition=Q(tenant__isnull=False),
                name="savedview_unique_shared_name",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.name}"


class AccessEvent(models.Model):
    """Who did what to access or authority, outside any task's transition chain.

    Logins and failed logins, logouts, the second factor (passed, failed, enrolled, a
    recovery code used), refused requests (403), role grants and revocations, token
    creation and revocation, and reveals of sensitive fields.
    Append-only; auditors read it in the console and the API.
    """

    class Kind(models.TextChoices):
        LOGIN = "login"
        LOGIN_FAILED = "login_failed"
        LOGOUT = "logout"
        LOCKED_OUT = "locked_out"
        # The second factor approvers and admins give after the password (tenancy.second_factor).
        SECOND_FACTOR_PASSED = "second_factor_passed"
        SECOND_FACTOR_FAILED = "second_factor_failed"
        SECOND_FACTOR_ENROLLED = "second_factor_enrolled"
        RECOVERY_CODE_USED = "recovery_code_used"
        FORBIDDEN = "forbidden"
        ROLE_GRANTED = "role_granted"
        ROLE_REVOKED = "role_revoked"
        TOKEN_CREATED = "token_created"
        TOKEN_REVOKED = "token_revoked"
        REVEAL = "reveal"

    kind = models.CharField(max_length=32, choices=Kind.choices)
    at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The account acting (None for an anonymous caller; for a token event, the token's owner, whose
    # authority changed); ``username`` keeps the name that was typed or held even when no account
    # matches, or the account is later deleted.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    username = models.CharField(max_length=150, blank=True, default="")
    # The tenant concerned, when there is one (a role grant, a reveal); None for a login.
    tenant = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    ip = models.GenericIPAddressField(null=True, blank=True)
    path = models.CharField(max_length=500, blank=True, default="")
    # What it concerned, in words and ids (never a secret): "role=auditor", "task=… field=refund_card".
    detail = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["tenant", "-at"], name="accessevent_tenant_at")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind} {self.username}"


class Scope(models.TextChoices):
    """What an API token may be used for. A token does what its scopes *and* its user's roles allow."""

    READ = "read"  # safe methods: lists, details, histories
    OPERATE = "operate"  # operator controls and reruns
    APPROVE = "approve"  # deciding approval requests
    INTEGRATE = "integrate"  # starting tasks, answering them, delivering external events


class ApiToken(models.Model):
    """An API credential of one user. Only the key's SHA-256 is stored: the key is shown once.

    A token is usable while it is neither revoked nor past ``expires_at``. ``prefix`` is the
    key's first characters, kept in clear so people can tell tokens apart and revoke one.
    """

    PREFIX_LENGTH = 8

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=PREFIX_LENGTH, unique=True)
    # Hex SHA-256 of the whole key; authentication looks the token up by it (unique index).
    key_digest = models.CharField(max_length=64, unique=True)
    # Space-separated subset of Scope; ``scope_set`` reads it.
    scopes = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # Written at most once a minute per token (see tenancy.services.token_authenticate).
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=~models.Q(scopes=""), name="apitoken_has_scope")]

    def __str__(self) -> str:
        return f"{self.prefix}… {self.name or 'token'} of {self.user}"

    @property
    def scope_set(self) -> frozenset[str]:
        return frozenset(self.scopes.split())
