"""Tenants and per-tenant roles.

Every task belongs to one tenant, and every read or write the API and the
console make is scoped to the tenants the caller holds a membership in.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    OPERATOR = "operator"
    APPROVER = "approver"
    AUDITOR = "auditor"
    ADMIN = "admin"


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
    """A named queue filter of one user: the query string the queue page was showing."""

    NAME_MAX = 80
    QUERY_MAX = 1000

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=NAME_MAX)
    query = models.CharField(max_length=QUERY_MAX, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="savedview_unique_name"),
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.name}"
