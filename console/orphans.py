"""Orphan effects: what the external systems hold that our ledger forgot (after a restore).

Read-only: the open orphans ``manage.py recover --apply`` recorded for the user's
tenants, newest first, the ones settled by a re-created task, and the restores recorded
(``RestoreRecord``: when, the window searched, the tasks lost, the orphans found). Operators, admins
and auditors of a tenant read them (``runtime.alerts.READ_ROLES``); orphans whose key
names no tenant are for the database's operators (``recover``'s output), never here.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from console.access import tenant_ids_or_403
from ledger.models import OrphanEffect, OrphanStatus, RestoreRecord
from runtime.alerts import READ_ROLES

LIMIT = 200  # a restore that lost more is read with `recover` (every line) rather than on one page


@require_safe
@login_required
def orphan_list(request: HttpRequest) -> HttpResponse:
    tenant_ids = tenant_ids_or_403(request.user, READ_ROLES)
    rows = OrphanEffect.objects.filter(tenant_id__in=tenant_ids).select_related("tenant")
    restores = RestoreRecord.objects.filter(tenant_id__in=tenant_ids).select_related("tenant")
    context = {
        "open": list(rows.filter(status=OrphanStatus.OPEN).order_by("-found_at", "-id")[:LIMIT]),
        "settled": list(rows.filter(status=OrphanStatus.SETTLED).order_by("-settled_at", "-id")[:LIMIT]),
        "restores": list(restores.order_by("-at", "-id")[:LIMIT]),
        "limit": LIMIT,
    }
    return render(request, "console/orphans.html", context)
