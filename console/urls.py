from __future__ import annotations

from django.urls import path

from console import (
    access_log,
    alerts,
    audit,
    bulk,
    dashboard,
    failed,
    legal_hold,
    orphans,
    preferences,
    quarantine,
    saved_views,
    task_page,
    task_types,
    views,
)
from console import queue as queue_export

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("tasks/<uuid:task_id>/", task_page.task_detail, name="task"),
    # Before the controls' catch-all: "answer", "rerun", "compensate" are not transition-table controls
    # (nor is "fork", resuming from a checkpoint).
    path("tasks/<uuid:task_id>/answer/", task_page.task_answer, name="task-answer"),
    path("tasks/<uuid:task_id>/rerun/", task_page.task_rerun, name="task-rerun"),
    path("tasks/<uuid:task_id>/compensate/", task_page.task_compensate, name="task-compensate"),
    path("tasks/<uuid:task_id>/fork/", task_page.task_fork, name="task-fork"),  # resume from a checkpoint
    path("tasks/<uuid:task_id>/reveal/", task_page.task_reveal, name="task-reveal"),
    path("tasks/<uuid:task_id>/legal-hold/", legal_hold.task_legal_hold, name="task-legal-hold"),
    path("tasks/<uuid:task_id>/<slug:control>/", task_page.task_control, name="task-control"),
    path("start/", views.landing, name="landing"),
    path("approvals/", views.approval_inbox, name="approvals"),
    path("approvals/<uuid:request_id>/", views.approval_detail, name="approval"),
    path("approvals/<uuid:request_id>/decide/", views.approval_decide, name="approval-decide"),
    path("audit/", audit.search, name="audit"),
    path("audit/export.<str:fmt>", audit.search_export, name="audit-export"),
    path("audit/tasks/<uuid:task_id>/", audit.task_history, name="audit-task"),
    path("audit/tasks/<uuid:task_id>/export.<str:fmt>", audit.task_export, name="audit-task-export"),
    path("quarantine/", quarantine.triage, name="quarantine"),
    path("failed/", failed.triage, name="failed"),
    path("dashboard/", dashboard.dashboard, name="dashboard"),
    path("theme/", preferences.theme, name="theme"),
    path("export.csv", queue_export.export_csv, name="queue-export"),
    path("views/", saved_views.save, name="saved-view-save"),
    path("views/<int:view_id>/delete/", saved_views.delete, name="saved-view-delete"),
    path("bulk/", bulk.operations, name="bulk-list"),
    path("bulk/new/", bulk.preview, name="bulk-preview"),
    path("bulk/<uuid:operation_id>/", bulk.report, name="bulk-report"),
    path("access/", access_log.access_events, name="access"),
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/<int:alert_id>/acknowledge/", alerts.alert_acknowledge, name="alert-acknowledge"),
    path("alerts/<int:alert_id>/snooze/", alerts.alert_snooze, name="alert-snooze"),
    path("orphans/", orphans.orphan_list, name="orphans"),
    path("task-types/", task_types.task_type_list, name="task-types"),
]
