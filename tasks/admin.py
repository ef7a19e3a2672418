from django.contrib import admin

from tasks.models import Checkpoint, Task


class ReadOnlyAdmin(admin.ModelAdmin):
    """State, version, checkpoints are written by the transition primitive only."""

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Task)
class TaskAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "task_type", "state", "state_version", "updated_at")
    list_filter = ("state", "task_type", "tenant")
    search_fields = ("id", "objective")


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ("task", "state_version", "schema_version", "codec", "created_at")
