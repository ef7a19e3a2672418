from django.urls import path

from console import audit, quarantine, views

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task"),
    path("tasks/<uuid:task_id>/<slug:control>/", views.task_control, name="task-control"),
    path("start/", views.landing, name="landing"),
    path("approvals/", views.approval_inbox, name="approvals"),
    path("approvals/<uuid:request_id>/", views.approval_detail, name="approval"),
    path("approvals/<uuid:request_id>/decide/", views.approval_decide, name="approval-decide"),
    path("audit/", audit.search, name="audit"),
    path("audit/export.<str:fmt>", audit.search_export, name="audit-export"),
    path("audit/tasks/<uuid:task_id>/", audit.task_history, name="audit-task"),
    path("audit/tasks/<uuid:task_id>/export.<str:fmt>", audit.task_export, name="audit-task-export"),
    path("quarantine/", quarantine.triage, name="quarantine"),
]
