from __future__ import annotations

from django.contrib import admin

from approvals.models import ApprovalDecision, ApprovalRequest
from audit.admin import ReadOnlyAdmin


@admin.register(ApprovalRequest)
class ApprovalRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "tenant", "task", "action_step", "status", "expires_at")
    list_filter = ("status", "tenant")


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(ReadOnlyAdmin):
    list_display = ("request", "decision", "decided_by", "decided_at")
