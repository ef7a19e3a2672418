"""Server-rendered console pages. Reads go through selectors, writes through services."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from approvals import selectors as approval_selectors
from approvals import services as approval_services
from approvals.models import ApprovalRequest, Decision
from audit.models import LeaseTakeover, TransitionEvent
from console.access import can_operate, get_task_for_user
from console.forms import ControlForm, DecisionForm, InboxForm
from ledger.models import Action
from runtime import controls
from tasks import selectors
from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.leases import live_lease_exists
from tasks.models import Checkpoint, Lease
from tasks.states import State
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for, tenants_for

PAGE = 50
TAKEOVERS_SHOWN = 5  # newest lease takeovers on a task page


@login_required
def queue(request):
    filters = selectors.TaskFilter(request.GET or None, queryset=selectors.visible_tasks(request.user))
    tasks = filters.qs if filters.is_bound and filters.is_valid() else selectors.visible_tasks(request.user)
    try:
        before = UUID(request.GET.get("before", ""))
    except ValueError:  # absent or mangled cursor: first page
        before = None
    if before:
        tasks = tasks.filter(id__lt=before)
    rows = list(
        tasks.select_related("tenant")
        .annotate(leased=live_lease_exists(timezone.now()))
        .order_by("-id")[: PAGE + 1]
    )
    query = request.GET.copy()
    query.pop("before", None)
    context = {
        "filters": filters,
        "tasks": rows[:PAGE],
        "next_before": rows[PAGE - 1].id if len(rows) > PAGE else None,
        "query": query.urlencode(),
        "states": State,
    }
    return render(request, "console/queue.html", context)


@login_required
def task_detail(request, task_id):
    task = get_task_for_user(request.user, task_id)
    offered = []
    if can_operate(request.user, task):
        triggers = {move["trigger"] for move in selectors.allowed_moves(request.user, task)}
        offered = [name for name, trigger in controls.CONTROLS.items() if trigger in triggers]
    context = {
        "task": task,
        "events": TransitionEvent.objects.filter(task=task).order_by("-state_version")[:200],
        "checkpoints": Checkpoint.objects.filter(task=task).order_by("-state_version")[:20],
        "controls": offered,
        "form": ControlForm(initial={"expected_version": task.state_version}),
        "ledger": selectors.ledger_summary(task),
        "actions": Action.objects.filter(task=task).order_by("id")[:50],
        "approvals": ApprovalRequest.objects.filter(task=task).order_by("-created_at")[:20],
        "lease": Lease.objects.filter(task=task, expires_at__gt=timezone.now()).first(),
        "takeovers": LeaseTakeover.objects.filter(task=task).order_by("-taken_at")[:TAKEOVERS_SHOWN],
    }
    return render(request, "console/task_detail.html", context)


@login_required
@require_POST
def task_control(request, task_id, control):
    if control not in controls.CONTROLS:
        raise Http404("No such control")
    task = get_task_for_user(request.user, task_id)
    if not can_operate(request.user, task):
        raise PermissionDenied
    form = ControlForm(request.POST)
    if not form.is_valid():
        messages.error(
            request,
            "A reason is required: "
            + "; ".join(f"{field}: {' '.join(map(str, errors))}" for field, errors in form.errors.items()),
        )
        return redirect("console:task", task_id=task.id)
    data = {key: value for key, value in form.cleaned_data.items() if value not in ("", None)}
    try:
        result = controls.task_control(
            task, control, user=request.user, roles=selectors.roles_in(request.user, task), **data
        )
    except StaleVersion as exc:
        messages.error(
            request,
            f"This task changed since you opened it (it is now {exc.state}, "
            f"version {exc.state_version}). Review it and try again.",
        )
    except TransitionNotAllowed as exc:
        messages.error(request, f"Not possible: {exc}")
    except CheckpointUnreadable as exc:
        messages.error(request, f"The task's checkpoint cannot be read ({exc.reason}); it needs quarantine.")
    else:
        note = f" ({result.note})" if result.note else ""
        if result.applied:
            messages.success(
                request, f"{control.title()} applied; the task is now {result.task.state}.{note}"
            )
        else:
            messages.info(request, f"Nothing changed: the task is {result.task.state}.{note}")
    return redirect("console:task", task_id=task.id)


@login_required
def landing(request):
    """Where a login lands: approvers on their inbox, everyone else on the queue."""
    if tenant_ids_for(request.user, [Role.APPROVER]):
        return redirect("console:approvals")
    return redirect("console:queue")


@login_required
def approval_inbox(request):
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
    """Everything a request page shows: what it authorizes, how it stands now, and what it repeats."""
    standing = approval_services.standing(approval)
    earlier = approval_selectors.earlier_request(approval)
    return {
        "approval": approval,
        "live": approval_selectors.is_live(approval),
        "expired": timezone.now() >= approval.expires_at,
        "changed": standing.changed,
        "evidence": [{**ref, "url": approval_selectors.evidence_url(ref)} for ref in approval.evidence],
        "evidence_unreadable": standing.evidence_now is None,
        "evidence_changes": approval_selectors.evidence_changes(approval, standing.evidence_now or []),
        "earlier": earlier,
        "repeat_changes": approval_selectors.repeat_changes(earlier, approval) if earlier else [],
        "can_decide": approval_selectors.may_decide_now(user, approval),
    }


@login_required
def approval_detail(request, request_id):
    approval = approval_selectors.get_visible_request(request.user, request_id)
    return render(request, "console/approval_detail.html", _approval_context(request.user, approval))


@login_required
@require_POST
def approval_decide(request, request_id):
    approval = approval_selectors.get_visible_request(request.user, request_id)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose approve or reject; the digest you saw is required.")
        return redirect("console:approval", request_id=approval.pk)
    data = form.cleaned_data
    if data["decision"] == Decision.APPROVE and not data["confirmed"]:
        # The confirm step: the same page, asking once more before anything is decided.
        context = _approval_context(request.user, approval)
        if context["can_decide"]:
            context.update(confirming=True, comment=data["comment"], digest_seen=data["digest"])
            return render(request, "console/approval_detail.html", context)
    try:
        decided = approval_services.approval_decide(
            approval,
            user=request.user,
            decision=data["decision"],
            digest_seen=data["digest"],
            comment=data["comment"],
        )
    except approval_services.ApprovalRefused as exc:
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
    return redirect("console:task", task_id=approval.task_id)
