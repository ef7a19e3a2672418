from django.contrib import admin

from audit.models import LeaseTakeover, TransitionEvent
from tasks.admin import ReadOnlyAdmin


@admin.register(TransitionEvent)
class TransitionEventAdmin(ReadOnlyAdmin):
    """The log is append-only, and only the transition primitive appends."""

    list_display = ("task", "state_version", "from_state", "to_state", "trigger", "actor_id", "created_at")
    list_filter = ("to_state", "trigger", "actor_kind")

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(LeaseTakeover)
class LeaseTakeoverAdmin(ReadOnlyAdmin):
    """Written by the lease claim only; append-only like the log."""

    list_display = ("task", "worker_id", "previous_worker_id", "stale_token", "token", "taken_at")

    def has_change_permission(self, request, obj=None):
        return False
