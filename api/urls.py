from django.urls import path

from api import approvals
from api import tasks as api
from runtime.controls import CONTROLS

urlpatterns = (
    [
        path("tasks/", api.TaskCollectionApi.as_view(), name="api-tasks"),
        path("tasks/<uuid:task_id>/", api.TaskDetailApi.as_view(), name="api-task"),
        path("tasks/<uuid:task_id>/events/", api.TaskEventsApi.as_view(), name="api-task-events"),
        path(
            "tasks/<uuid:task_id>/checkpoints/", api.TaskCheckpointsApi.as_view(), name="api-task-checkpoints"
        ),
        path("tasks/<uuid:task_id>/actions/", api.TaskActionsApi.as_view(), name="api-task-actions"),
        path("tasks/<uuid:task_id>/input/", api.TaskInputApi.as_view(), name="api-task-input"),
        path(
            "tasks/<uuid:task_id>/external-events/",
            api.TaskExternalEventApi.as_view(),
            name="api-task-events-in",
        ),
    ]
    + [
        path(f"tasks/<uuid:task_id>/{name}/", api.control_view(name), name=f"api-task-{name}")
        for name in CONTROLS
    ]
    + [
        path("approvals/", approvals.ApprovalListApi.as_view(), name="api-approvals"),
        path("approvals/<uuid:request_id>/", approvals.ApprovalDetailApi.as_view(), name="api-approval"),
        path(
            "approvals/<uuid:request_id>/decide/",
            approvals.ApprovalDecideApi.as_view(),
            name="api-approval-decide",
        ),
    ]
)
