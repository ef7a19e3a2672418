"""Saved views: named queue filters (``tenancy.SavedView``), saved and deleted by plain POSTs.

The queue lists them as links: the user's own, then those shared with their tenants (an operator or
admin shares one with a tenant when saving it). Saving keeps only the queue's filter keys and its sort
(``tenancy.services.clean_query``); deleting asks once more before anything is deleted.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from console.forms import SavedViewForm
from console.posting import Done, Refusal, form_post
from reads.queue import TaskFilter
from tenancy import services
from tenancy.models import Role, SavedView
from tenancy.selectors import deletable_views_for, saved_views_for, tenant_ids_for, tenants_for

# What a saved view may hold: the queue's filters and its order (never a paging cursor).
QUEUE_KEYS = (*TaskFilter.base_filters, "sort")


def for_queue(user: Any) -> dict[str, Any]:
    """What the queue page shows of saved views: the list, which of them ``user`` may delete, and the
    tenants they may share a new one with (``services.SHARE_ROLES``)."""
    views = list(saved_views_for(user))
    administered = set(tenant_ids_for(user, [Role.ADMIN]))  # deletable_views_for's rule, on the list read
    return {
        "saved_views": views,
        "deletable_views": {v.pk for v in views if v.user_id == user.pk or v.tenant_id in administered},
        "share_tenants": list(tenants_for(user).filter(id__in=tenant_ids_for(user, services.SHARE_ROLES))),
    }


def _back(query: str) -> str:
    return f"{reverse('console:queue')}?{query}" if query else reverse("console:queue")


@login_required
@require_POST
def save(request: HttpRequest) -> HttpResponse:
    query = request.POST.get("query", "")

    def act(data: dict[str, Any]) -> Done:
        tenant = None
        if data["share"]:
            tenant = tenants_for(request.user).filter(slug=data["share"]).first()
            if tenant is None:
                raise services.SavedViewRefused(f"You have no role in a tenant named “{data['share']}”.")
        view = services.saved_view_create(
            request.user, name=data["name"], query=data["query"], allowed_keys=QUEUE_KEYS, tenant=tenant
        )
        shared = f", shared with {tenant.slug}" if tenant is not None else ""
        return Done(f"Saved the view “{view.name}”{shared}.", to=_back(view.query))

    back = _back(services.clean_query(query[: SavedView.QUERY_MAX], QUEUE_KEYS))
    refused = Refusal(services.SavedViewRefused, str)
    return form_post(request, SavedViewForm(request.POST), act, back=back, refusals=(refused,))


@login_required
@require_POST
def delete(request: HttpRequest, view_id: int) -> HttpResponse:
    """Without ``confirm``: the confirmation page. With it: delete, back to the queue."""
    view = deletable_views_for(request.user).filter(pk=view_id).first()
    if view is None:
        raise Http404("No such saved view")
    if not request.POST.get("confirm"):
        return render(request, "console/saved_view_delete.html", {"view": view})
    services.saved_view_delete(request.user, view.pk)
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect("console:queue")
