"""Admin for accounts, tenants, roles, API tokens and the access log.

Roles change through ``tenancy.services`` only (so each change is recorded and the
guardian group follows); tokens are never shown, only their prefix, name, scopes
and dates, and the one thing to do with one here is revoke it. What only the owner
role may write (an account's staff flags, deleting an account or a tenant, whose
memberships go with it) is refused on the page when connected as another role,
naming the owner, instead of a permission error and a 500.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import UserChangeForm
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import QuerySet
from django.http import HttpRequest

from tenancy.dbrole import not_owner, owner_needed
from tenancy.models import AccessEvent, ApiToken, Membership, Tenant
from tenancy.services import change_role, grant_role, revoke_role, token_revoke

# What the trigger on auth_user (tenancy migration 0005) refuses every role but the owner.
OWNER_FLAGS = ("is_staff", "is_superuser")


class AccountChangeForm(UserChangeForm):
    """Django's account form, refusing a change of the staff flags unless connected as the owner."""

    def clean(self) -> dict[str, Any] | None:
        cleaned = super().clean()
        changed = [name for name in OWNER_FLAGS if name in self.changed_data]
        refusal = owner_needed(f"Changing {' and '.join(changed)}") if changed else None
        if refusal:
            raise ValidationError(f"{refusal} Nothing was saved.")
        return cleaned


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class AccountAdmin(UserAdmin):
    form = AccountChangeForm

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Its memberships go with it (the owner's to write) and its access events lose their link.
        return super().has_delete_permission(request, obj) and not_owner() is None


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and not_owner() is None  # memberships go too


def _may_write_memberships() -> bool:
    """Whether this connection may change roles: on PostgreSQL the app role may not (``db_roles``),
    roles are granted connected as the owner; the pages then show them read-only instead of a 500."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT has_table_privilege(%s, 'INSERT')", [Membership._meta.db_table])
        (allowed,) = cursor.fetchone()
    return bool(allowed)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("tenant", "role")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return super().has_add_permission(request) and _may_write_memberships()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_change_permission(request, obj) and _may_write_memberships()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_delete_permission(request, obj) and _may_write_memberships()

    def save_model(self, request: HttpRequest, obj: Membership, form: Any, change: bool) -> None:
        if change:
            # Editing a membership replaces it: the old role goes (row and group), the new one comes.
            old = Membership.objects.select_related("user", "tenant").get(pk=obj.pk)
            saved = change_role(old, user=obj.user, tenant=obj.tenant, role=obj.role, request=request)
        else:
            saved = grant_role(obj.user, obj.tenant, obj.role, request=request)  # also joins the role's group
        obj.pk = saved.pk  # the admin's next page links to what is stored now

    def delete_model(self, request: HttpRequest, obj: Membership) -> None:
        revoke_role(obj.user, obj.tenant, obj.role, request=request)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Membership]) -> None:
        # The bulk "delete selected" action too: each role goes with its group, and is recorded.
        for membership in queryset.select_related("user", "tenant"):
            revoke_role(membership.user, membership.tenant, membership.role, request=request)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created with ``manage.py drf_create_token``; here they are listed and revoked."""

    list_display = (
        "prefix",
        "name",
        "user",
        "scopes",
        "created_at",
        "expires_at",
        "revoked_at",
        "last_used_at",
    )
    list_filter = ("scopes",)
    search_fields = ("prefix", "name", "user__username")
    fields = ("prefix", "name", "user", "scopes", "created_at", "expires_at", "revoked_at", "last_used_at")
    readonly_fields = fields  # never the digest, and nothing editable
    actions = ("revoke",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoked, not deleted: the record of who held what stays

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        revoked = sum(token_revoke(token, request=request) for token in queryset)
        self.message_user(request, f"Revoked {revoked} token(s).", messages.SUCCESS)


@admin.register(AccessEvent)
class AccessEventAdmin(admin.ModelAdmin):
    """The access log, read-only (append-only like the audit log)."""

    list_display = ("at", "kind", "username", "tenant", "ip", "path", "detail")
    list_filter = ("kind", "tenant")
    search_fields = ("username", "detail", "ip")
    date_hierarchy = "at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
