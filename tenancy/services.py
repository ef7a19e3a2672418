"""Granting roles. A role is a membership row plus the tenant's group for that
role, which is what object permissions (django-guardian) are granted to."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import Group

from tenancy.models import Membership, Role, Tenant


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
