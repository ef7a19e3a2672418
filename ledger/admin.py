from django.contrib import admin

from audit.admin import ReadOnlyAdmin
from ledger.models import Action


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "connector", "dispatch_state", "attempts", "created_at")
    list_filter = ("dispatch_state", "connector")
