"""Admin for the retention records: policies are edited here; holds and archives are only read."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.admin import ReadOnlyAdmin
from tasks.models import Archive, LegalHold, RetentionPolicy


@admin.register(RetentionPolicy)
class RetentionPolicyAdmin(admin.ModelAdmin):
    """Editable: how long each tenant keeps its ended tasks, per type (``protection.retention``)."""

    list_display = (
        "tenant",
        "task_type",
        "archive_after_days",
        "delete_after_days",
        "changed_at",
        "changed_by",
    )
    list_filter = ("tenant",)
    readonly_fields = ("changed_at", "changed_by")

    def save_model(self, request: HttpRequest, obj: RetentionPolicy, form: Any, change: bool) -> None:
        obj.changed_by = request.user.get_username()
        super().save_model(request, obj, form, change)


@admin.register(LegalHold)
class LegalHoldAdmin(ReadOnlyAdmin):
    """Placed and lifted by tenant admins on the task page or the API, never here: the record is theirs."""

    list_display = ("task", "placed_by", "placed_at", "lifted_by", "lifted_at")
    list_filter = ("lifted_at",)


@admin.register(Archive)
class ArchiveAdmin(ReadOnlyAdmin):
    """Written by retention only."""

    list_display = ("task", "archived_at", "erased", "rule")
