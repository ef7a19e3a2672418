"""Saved views: a user's named queue filters (``tenancy.SavedView``), saved and deleted by plain POSTs.

The queue lists them as links; saving keeps only the queue's filter keys and its sort
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
from tenancy.models import SavedView
from tenancy.selectors import saved_views_for

# What a saved view may hold: the queue's filters and its order (never a paging cursor).
QUEUE_KEYS = (*TaskFilter.base_filters, "sort")


def _back(query: str) -> str:
    return f"{reverse('console:queue')}?{query}" if query else reverse("console:queue")


@login_required
@require_POST
def save(request: HttpRequest) -> HttpResponse:
    query = request.POST.get("query", "")

    def act(data: dict[str, Any]) -> Done:
        view = services.saved_view_create(
            request.user, name=data["name"], query=data["query"], allowed_keys=QUEUE_KEYS
        )
        return Done(f"Saved the view “{view.name}”.", to=_back(view.query))

    back = _back(services.clean_query(query[: SavedView.QUERY_MAX], QUEUE_KEYS))
    refused = Refusal(services.SavedViewRefused, str)
    return form_post(request, SavedViewForm(request.POST), act, back=back, refusals=(refused,))


@login_required
@require_POST
def delete(request: HttpRequest, view_id: int) -> HttpResponse:
    """Without ``confirm``: the confirmation page. With it: delete, back to the queue."""
    view = saved_views_for(request.user).filter(pk=view_id).first()
    if view is None:
        raise Http404("No such saved view")
    if not request.POST.get("confirm"):
        return render(request, "console/saved_view_delete.html", {"view": view})
    services.saved_view_delete(request.user, view.pk)
    messages.success(request, f"Deleted the view “{view.name}”.")
    return redirect("console:queue")
