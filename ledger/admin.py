from django.contrib import admin

from ledger.models import Action
from tasks.admin import ReadOnlyAdmin


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "connector", "dispatch_state", "attempts", "created_at")
    list_filter = ("dispatch_state", "connector")
