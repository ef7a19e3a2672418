from __future__ import annotations

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from audit.models import LeaseTakeover, Tombstone, TransitionEvent


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records only their own code writes (the log, state, checkpoints, the ledger): read-only here.

    Viewed, never saved: a save would rewrite every column, which the append-only triggers and the
    app role's column privileges refuse (a 500), and would bypass the code that owns the row."""

    def get_readonly_fields(self, request: HttpRequest, obj: Model | None = None) -> list[str]:
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        return False


@admin.register(TransitionEvent)
class TransitionEventAdmin(ReadOnlyAdmin):
    """The log is append-only, and only the transition primitive appends."""

    list_display = ("task", "state_version", "from_state", "to_state", "trigger", "actor_id", "created_at")
    list_filter = ("to_state", "trigger", "actor_kind")


@admin.register(LeaseTakeover)
class LeaseTakeoverAdmin(ReadOnlyAdmin):
    """Written by the lease claim only; append-only like the log."""

    list_display = ("task", "worker_id", "previous_worker_id", "stale_token", "token", "taken_at")


@admin.register(Tombstone)
class TombstoneAdmin(ReadOnlyAdmin):
    """Written by retention only, sealed with the chain key; append-only like the log."""

    list_display = ("task_id", "tenant", "task_type", "state_version", "deleted_at", "reason")
