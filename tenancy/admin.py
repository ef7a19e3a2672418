from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from tenancy.models import Membership, Tenant
from tenancy.services import grant_role, revoke_role


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("tenant", "role")

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        grant_role(obj.user, obj.tenant, obj.role)  # also joins the role's group

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        revoke_role(obj.user, obj.tenant, obj.role)
