from __future__ import annotations

from django.contrib import admin

from audit.admin import ReadOnlyAdmin
from ledger.models import Action, MoneyMovement


@admin.register(Action)
class ActionAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "connector", "dispatch_state", "attempts", "created_at")
    list_filter = ("dispatch_state", "connector")


@admin.register(MoneyMovement)
class MoneyMovementAdmin(ReadOnlyAdmin):
    list_display = ("action", "task_type", "requester", "reference", "amount", "currency", "created_at")
    list_filter = ("task_type", "currency")
