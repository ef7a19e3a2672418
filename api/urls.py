from __future__ import annotations

from django.urls import path

from api.views.access import AccessEventListApi
from api.views.alerts import AlertAcknowledgeApi, AlertListApi, AlertSnoozeApi
from api.views.approvals import ApprovalDecideApi, ApprovalDetailApi, ApprovalListApi
from api.views.forks import TaskForkApi
from api.views.legal_hold import TaskLegalHoldApi
from api.views.reveal import TaskRevealApi
from api.views.task_types import TaskTypeDetailApi, TaskTypeListApi
from api.views.tasks import (
    TaskActionsApi,
    TaskCheckpointsApi,
    TaskCollectionApi,
    TaskCompensateApi,
    TaskControlApi,
    TaskDetailApi,
    TaskEventsApi,
    TaskExternalEventApi,
    TaskInputApi,
    TaskRerunApi,
)
from runtime.controls import CONTROLS

urlpatterns = (
    [
        path("tasks/", TaskCollectionApi.as_view(), name="api-tasks"),
        path("tasks/<uuid:task_id>/", TaskDetailApi.as_view(), name="api-task"),
        path("tasks/<uuid:task_id>/events/", TaskEventsApi.as_view(), name="api-task-events"),
        path("tasks/<uuid:task_id>/checkpoints/", TaskCheckpointsApi.as_view(), name="api-task-checkpoints"),
        path("tasks/<uuid:task_id>/actions/", TaskActionsApi.as_view(), name="api-task-actions"),
        path("tasks/<uuid:task_id>/input/", TaskInputApi.as_view(), name="api-task-input"),
        path("tasks/<uuid:task_id>/rerun/", TaskRerunApi.as_view(), name="api-task-rerun"),
        path("tasks/<uuid:task_id>/fork/", TaskForkApi.as_view(), name="api-task-fork"),
        path("tasks/<uuid:task_id>/compensate/", TaskCompensateApi.as_view(), name="api-task-compensate"),
        path("tasks/<uuid:task_id>/reveal/", TaskRevealApi.as_view(), name="api-task-reveal"),
        path("tasks/<uuid:task_id>/legal-hold/", TaskLegalHoldApi.as_view(), name="api-task-legal-hold"),
        path(
            "tasks/<uuid:task_id>/external-events/", TaskExternalEventApi.as_view(), name="api-task-events-in"
        ),
    ]
    + [
        path(f"tasks/<uuid:task_id>/{name}/", TaskControlApi.as_view(control=name), name=f"api-task-{name}")
        for name in CONTROLS
    ]
    + [
        path("approvals/", ApprovalListApi.as_view(), name="api-approvals"),
        path("approvals/<uuid:request_id>/", ApprovalDetailApi.as_view(), name="api-approval"),
        path("approvals/<uuid:request_id>/decide/", ApprovalDecideApi.as_view(), name="api-approval-decide"),
        path("access-events/", AccessEventListApi.as_view(), name="api-access-events"),
        path("alerts/", AlertListApi.as_view(), name="api-alerts"),
        path(
            "alerts/<int:alert_id>/acknowledge/", AlertAcknowledgeApi.as_view(), name="api-alert-acknowledge"
        ),
        path("alerts/<int:alert_id>/snooze/", AlertSnoozeApi.as_view(), name="api-alert-snooze"),
        path("task-types/", TaskTypeListApi.as_view(), name="api-task-types"),
        path("task-types/<str:task_type>/", TaskTypeDetailApi.as_view(), name="api-task-type"),
    ]
)
