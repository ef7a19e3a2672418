"""Read-side queries: tenant first, then the object permission (django-guardian)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import django_filters
from django.db.models import F
from django.http import Http404
from django.utils import timezone
from guardian.shortcuts import get_objects_for_user

from approvals.models import ApprovalRequest, ApprovalStatus
from config.external import connector_url
from tasks.states import State
from tenancy.selectors import tenant_ids_for

DECIDE = "approvals.decide_approvalrequest"


class ApprovalFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=ApprovalStatus.choices)
    task_type = django_filters.CharFilter(field_name="task__task_type")
    tenant = django_filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = ApprovalRequest
        fields = ["status", "task_type", "tenant"]


def visible_requests(user: Any):
    return ApprovalRequest.objects.filter(tenant_id__in=tenant_ids_for(user))


def get_visible_request(user: Any, request_id) -> ApprovalRequest:
    found = (
        visible_requests(user).select_related("task", "tenant", "decision__decided_by").filter(pk=request_id)
    )
    request = found.first()
    if request is None:
        raise Http404("No such approval request")
    return request


def is_live(request: ApprovalRequest) -> bool:
    """Pending, unexpired, and its task still waits for exactly this request."""
    return (
        request.status == ApprovalStatus.PENDING
        and timezone.now() < request.expires_at
        and request.task.state == State.WAITING_APPROVAL
        and request.task.state_version == request.waiting_version
    )


def evidence_url(ref: dict[str, Any]) -> str:
    """Where an approver can open the record an evidence reference points to."""
    return f"{connector_url(ref.get('system', ''))}/records/{quote(str(ref.get('record_id', '')), safe='')}"


def inbox(user: Any):
    """Requests ``user`` may decide now, oldest first."""
    live = (
        ApprovalRequest.objects.filter(
            tenant_id__in=tenant_ids_for(user),
            status=ApprovalStatus.PENDING,
            expires_at__gt=timezone.now(),
            task__state=State.WAITING_APPROVAL,
            task__state_version=F("waiting_version"),
        )
        .exclude(requested_by=f"user:{user.get_username()}")
        .select_related("task", "tenant", "decision__decided_by")
    )
    mine = get_objects_for_user(user, DECIDE, klass=live, accept_global_perms=False)
    return mine.filter(tenant_id__in=tenant_ids_for(user, ["approver"])).order_by("created_at")
