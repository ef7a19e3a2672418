"""Server-rendered console pages. Reads go through selectors, writes through services."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_POST
from django_htmx.middleware import HtmxDetails

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest, Decision
from console import queue as queue_parts
from console import saved_views, sign_in
from console.bulk import carried_filters
from console.forms import DecisionForm, InboxForm
from reads.approval_detail import read_approval_detail
from runtime.bulk import CONTROLS
from tasks.checkpoints import CheckpointUnreadable
from tasks.states import State
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for, tenants_for

PAGE = 50


class HtmxHttpRequest(HttpRequest):
    """A request as django-htmx's middleware hands it on: with ``htmx``, what the page's htmx asked."""

    htmx: HtmxDetails


@login_required
def queue(request: HtmxHttpRequest) -> HttpResponse:
    filters, tasks, tenants = queue_parts.filtered(request, request.GET)
    page = queue_parts.page(tasks, request.GET, size=PAGE, tenants=tenants)
    can_bulk = bool(tenant_ids_for(request.user, [Role.OPERATOR, Role.ADMIN]))
    if request.htmx:  # the live refresh: the visible page's rows only
        rows = render(request, "console/queue_rows.html", {"tasks": page.tasks, "can_bulk": can_bulk})
        patch_vary_headers(rows, ["HX-Request"])
        return rows
    params = request.GET.copy()
    for key in ("before", "after"):
        params.pop(key, None)
    without_state = params.copy()
    without_state.pop("state", None)
    context = {
        "filters": filters,
        "page": page,
        "tasks": page.tasks,
        "sorts": queue_parts.SORTS,
        "query": params.urlencode(),
        "query_without_state": without_state.urlencode(),
        "counts": queue_parts.summary(request),
        "states": State,
        "can_bulk": can_bulk,
        "bulk_filters": carried_filters(params),
        "controls": list(CONTROLS),
        **saved_views.for_queue(request.user),
    }
    response = render(request, "console/queue.html", context)
    patch_vary_headers(response, ["HX-Request"])
    return response


# Where someone arrives without asking for a page: the site's root, or the console's (what the login
# page's ``next`` says when a bookmark of the console sent them to log in). They go to ``landing``.
NO_PAGE_ASKED = frozenset({"/", "/console/"})


def asked_for(next_url: str) -> str:
    """``next_url``, or "" when it names no particular page (then the landing page chooses)."""
    return "" if next_url in NO_PAGE_ASKED else next_url


class ConsoleLogin(auth_views.LoginView):
    """The login page; a ``next`` that names no particular page lands by role (``landing``)."""

    def get_redirect_url(self, request: HttpRequest | None = None) -> str:
        return asked_for(super().get_redirect_url())

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "sign_in_hints": sign_in.hints()}


@login_required
def landing(request: HttpRequest) -> HttpResponse:
    """Where a login lands: approvers on their inbox, auditors (who operate nowhere) on the audit log,
    everyone else on the queue."""
    if tenant_ids_for(request.user, [Role.APPROVER]):
        return redirect("console:approvals")
    if tenant_ids_for(request.user, [Role.AUDITOR]) and not tenant_ids_for(
        request.user, [Role.OPERATOR, Role.ADMIN]
    ):
        return redirect("console:audit")
    return redirect("console:queue")


@login_required
def approval_inbox(request: HttpRequest) -> HttpResponse:
    form = InboxForm(request.GET, tenants=tenants_for(request.user))
    query = form.query()
    page = approval_selectors.inbox_page(request.user, size=PAGE, **query)
    params = request.GET.copy()
    params.pop("after", None)
    context = {
        "form": form,
        "page": page,
        "status": query["status"],
        "status_label": approval_selectors.STATUSES[query["status"]],
        "query": params.urlencode(),
        "first_page": not query["cursor"],
    }
    return render(request, "console/approvals.html", context)


def _approval_context(user: Any, approval: ApprovalRequest) -> dict[str, Any]:
    """Everything a request page shows: its detail (``reads.approval_detail``, which the API serializes
    too), how it stands now against the task's facts, and what it repeats."""
    detail = read_approval_detail(approval, viewer=user)
    standing = approval_services.standing(approval)
    earlier = approval_selectors.earlier_request(approval)
    return {
        "approval": approval,
        "live": detail.live,
        "expired": timezone.now() >= approval.expires_at,
        "changed": standing.changed,
        "evidence": [{**ref, "url": approval_selectors.evidence_url(ref)} for ref in approval.evidence],
        "evidence_unreadable": standing.evidence_now is None,
        "evidence_changes": approval_selectors.evidence_changes(approval, standing.evidence_now or []),
        "earlier": earlier,
        "repeat_changes": approval_selectors.repeat_changes(earlier, approval) if earlier else [],
        "can_decide": approval_selectors.may_decide_now(user, approval),
        "separation": detail.separation,
        # The money policy's earlier effects for the same business reference (the same invoice).
        "earlier_effects": approval_services.earlier_effects(approval, standing.facts),
    }


@login_required
def approval_detail(request: HttpRequest, request_id: UUID) -> HttpResponse:
    approval = approval_selectors.get_visible_request(request.user, request_id)
    return render(request, "console/approval_detail.html", _approval_context(request.user, approval))


@login_required
@require_POST
def approval_decide(request: HttpRequest, request_id: UUID) -> HttpResponse:
    approval = approval_selectors.get_visible_request(request.user, request_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject; the digest you saw is required.")
        return redirect("console:approval", request_id=approval.pk)
    data = form.cleaned_data
    no_reason = data["decision"] == Decision.REJECT and not data["comment"].strip()
    if not data["confirmed"] or no_reason:
        # The confirm step: the same page, asking once more before anything is decided (and, to reject,
        # for the reason the task's operators will read).
        context = _approval_context(request.user, approval)
        if context["can_decide"]:
            context.update(
                confirming=data["decision"],
                comment=data["comment"],
                digest_seen=data["digest"],
                reason_missing=no_reason and data["confirmed"],
            )
            status = 400 if context["reason_missing"] else 200
            return render(request, "console/approval_detail.html", context, status=status)
    try:
        decided = approval_services.approval_decide(
            approval,
            user=request.user,
            decision=data["decision"],
            digest_seen=data["digest"],
            comment=data["comment"],
        )
    except approval_services.ApprovalRefused as exc:
        if exc.status == 403:  # a role that may read the request but not decide it: the console's 403 page
            raise PermissionDenied(str(exc)) from None
        messages.error(request, str(exc))
        return redirect("console:approval", request_id=approval.pk)
    except CheckpointUnreadable as exc:
        messages.error(request, f"The task's checkpoint cannot be read ({exc.reason}); nothing was decided.")
        return redirect("console:approval", request_id=approval.pk)
    verb = "Approved" if decided.request.status == "approved" else "Rejected"
    if decided.applied:
        messages.success(request, f"{verb}. The task moved on to {decided.task.state}.")
    else:
        messages.info(request, f"Nothing changed: this request was {decided.note}.")
    # On to the next request in the approver's inbox (or the inbox, when none is left).
    following = approval_selectors.next_to_decide(request.user, besides=approval)
    if following is None:
        return redirect("console:approvals")
    return redirect("console:approval", request_id=following.pk)
