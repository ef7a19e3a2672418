from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from audit.admin import ReadOnlyAdmin
from tasks.models import Checkpoint, Lease, Policy, RuntimeConfig, Task


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "task_type", "state", "state_version", "updated_at")
    list_filter = ("state", "task_type", "tenant")
    search_fields = ("id", "objective")


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("task", "state_version", "schema_version", "codec", "created_at")


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    """Editable: a new version makes every waiting task of the type revalidate on resume."""

    list_display = ("task_type", "version", "changed_at", "changed_by")
    readonly_fields = ("changed_at", "changed_by")

    def save_model(self, request: HttpRequest, obj: Policy, form: Any, change: bool) -> None:
        obj.changed_by = request.user.get_username()
        super().save_model(request, obj, form, change)


@admin.register(RuntimeConfig)
class RuntimeConfigAdmin(admin.ModelAdmin):
    """Editable: withdrawing approval sends resuming tasks to replan (or quarantine)."""

    list_display = ("task_type", "model_id", "prompt_id", "toolset_id", "approved", "current", "changed_at")
    list_filter = ("task_type", "approved", "current")


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ("task", "worker_id", "token", "heartbeat_at", "expires_at")
