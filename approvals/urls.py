from django.urls import path

from approvals import api

urlpatterns = [
    path("approvals/", api.ApprovalListApi.as_view(), name="api-approvals"),
    path("approvals/<uuid:request_id>/", api.ApprovalDetailApi.as_view(), name="api-approval"),
    path("approvals/<uuid:request_id>/decide/", api.ApprovalDecideApi.as_view(), name="api-approval-decide"),
]
