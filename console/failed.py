"""Failed-tasks triage: the failed tasks of the user's tenants, by reason, and a rerun for many at once.

Like the quarantine page (``console.quarantine``): it only reads — one GROUP BY for the counts per reason
and one keyset page of the chosen reason — and its one action, a rerun, goes to the bulk preview for the
ticked rows or for every task of the tenant's queue that failed for the reason, with one reason and a
confirmation, then the per-task report. Each rerun is a new task (``tasks.services.task_rerun``): the
failed one is never written, and an effect it already completed is not sent again.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.access import QUARANTINE_ROLES, tenant_ids_or_403
from reads import failed
from reads.quarantine import QuarantineCursor
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for

PAGE = 50


@require_safe
@login_required
def triage(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_or_403(request.user, QUARANTINE_ROLES)  # the same readers as quarantine
    counts = failed.failed_counts(tenant_ids)
    codes = [row["code"] for row in counts]
    code = request.GET.get("reason") if request.GET.get("reason") in codes else (codes[0] if codes else None)
    before = QuarantineCursor.parse(request.GET.get("before"))
    context = {
        "counts": counts,
        "total": sum(row["n"] for row in counts),
        "code": code,
        "page": failed.failed_tasks(tenant_ids, code=code, before=before, limit=PAGE)
        if code is not None
        else None,
        "can_act": bool(tenant_ids_for(request.user, [Role.OPERATOR, Role.ADMIN])),
    }
    return render(request, "console/failed.html", context)
