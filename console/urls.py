from django.urls import path

from console import views

app_name = "console"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("tasks/<uuid:task_id>/", views.task_detail, name="task"),
    path("tasks/<uuid:task_id>/<slug:control>/", views.task_control, name="task-control"),
    path("approvals/", views.approval_inbox, name="approvals"),
    path("approvals/<uuid:request_id>/", views.approval_detail, name="approval"),
    path("approvals/<uuid:request_id>/decide/", views.approval_decide, name="approval-decide"),
]
