"""Bulk actions from the queue: preview (count, sample), one reason, confirm, then the report.

The set is either the rows ticked on the queue (``ids``) or everything matching the
queue's filters (``target=all``), always inside the tenants where the user may
operate. Writes go through ``runtime.bulk`` only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from django import forms
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import OperationalError, connection, transaction
from django.db.models import BooleanField, Exists, Expression, F, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.urls import reverse

from console.access import AUDIT_ROLES, tenant_ids_or_403
from console.forms import ConsoleForm
from console.paging import Keyset, keyset_page
from reads import queue, visibility
from runtime import bulk, controls
from runtime.models import BulkOperation, BulkResult, BulkSnapshot, Outcome
from tasks.models import Task
from tenancy.models import Role
from tenancy.selectors import tenant_ids_for

OPERATE = (Role.OPERATOR, Role.ADMIN)
MAX_IDS = 500  # ticked rows per request; "everything matching" has no such limit (bulk.max_tasks())
SAMPLE = 20
RESULTS_SHOWN = 500
LIST_PAGE = 50
NEWEST = Keyset("before", ("-id",), (UUID,))  # past operations: ids are UUIDv7, time ordered


class BulkForm(ConsoleForm):
    control = forms.ChoiceField(choices=[(name, name) for name in bulk.CONTROLS])
    target = forms.ChoiceField(choices=[("selected", "selected rows"), ("all", "everything matching")])
    reason = forms.CharField(max_length=2000, required=False)
    scope = forms.ChoiceField(
        choices=[(s, s) for s in controls.CANCEL_SCOPES], initial="task", required=False
    )
    escalate_to = forms.ChoiceField(
        choices=[(r, r) for r in controls.ESCALATION_ROLES], initial="admin", required=False
    )


# What an "everything matching" selection keeps of a request: the queue's filters and nothing else (not
# the form, the paging, or the CSRF token a POST carries, which the report would show). A filter named
# like a field of the form (the outcome ``reason``) travels through the preview under another name:
# under its own, the operator's reason took its place and the selection lost that filter.
CARRIED = {
    key: f"filter_{key}" if key in BulkForm.base_fields else key for key in queue.TaskFilter.base_filters
}


def carried_filters(params: QueryDict) -> list[tuple[str, str]]:
    """The queue's filters in ``params`` (as the queue names them), as the preview's fields name them."""
    return [(CARRIED[key], value) for key in CARRIED for value in params.getlist(key) if value]


def _selection(request: HttpRequest, params: QueryDict, target: str) -> tuple[QuerySet[Task], dict[str, Any]]:
    """The tasks the operator means, limited to tenants where they may operate; and how to record it."""
    operable = visibility.visible_tasks(request.user).filter(
        tenant_id__in=tenant_ids_for(request.user, OPERATE)
    )
    if target == "all":
        filter_params = QueryDict(mutable=True)
        for key, name in CARRIED.items():
            if values := [value for value in params.getlist(name) if value]:
                filter_params.setlist(key, values)
        filters = queue.TaskFilter(filter_params, queryset=operable, request=request)
        if not filters.is_valid():
            return operable.none(), {"query": filter_params.urlencode(), "invalid": True}
        return filters.qs, {"query": filter_params.urlencode()}
    ids: list[UUID] = []
    for value in params.getlist("ids")[:MAX_IDS]:
        try:
            ids.append(UUID(value))
        except ValueError:
            continue
    return operable.filter(id__in=ids), {"ids": [str(i) for i in ids]}


def _filter_fields(params: QueryDict) -> list[tuple[str, str]]:
    """The selection, as hidden fields the confirmation posts back."""
    ids = [("ids", value) for value in params.getlist("ids")[:MAX_IDS]]
    return ids + [(name, value) for name in CARRIED.values() for value in params.getlist(name) if value]


def _back(params: QueryDict, selection: dict[str, Any]) -> str:
    """Where the operator came from: the triage list of a quarantine reason, or the filtered queue."""
    if params.get("held"):
        return f"{reverse('console:quarantine')}?{urlencode({'reason': params['held']})}"
    return f"{reverse('console:queue')}?{selection.get('query', '')}"


def exact_count(tasks: QuerySet[Task], *, budget_ms: int) -> int | None:
    """How many tasks match, exactly, or ``None`` when PostgreSQL cannot count them within ``budget_ms``
    (``statement_timeout`` for this one statement; the index-only scans of the tenant indexes count
    hundreds of thousands in that time)."""
    if connection.vendor != "postgresql":
        return tasks.order_by().count()
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT current_setting('statement_timeout'), set_config('statement_timeout', %s, true)",
                [f"{int(budget_ms)}ms"],
            )
            before = cursor.fetchone()[0]
            count = tasks.order_by().count()
            # Released, a savepoint keeps its SET LOCAL for the enclosing transaction: put it back.
            cursor.execute("SELECT set_config('statement_timeout', %s, true)", [before])
            return count
    except OperationalError:  # canceled at the budget; the savepoint's rollback undid the setting
        return None


def _count_url(params: QueryDict, data: dict[str, Any]) -> str:
    """The preview again, asking for the exact count with the follow-up budget (``count=full``)."""
    fields = [("control", data["control"]), ("target", data["target"]), *_filter_fields(params)]
    return f"{reverse('console:bulk-preview')}?{urlencode([*fields, ('count', 'full')])}"


@login_required
def preview(request: HttpRequest) -> HttpResponse:
    """GET: what would happen (count, a sample). POST: the confirmation — create, then run or queue."""
    tenant_ids_or_403(request.user, OPERATE)
    params = request.POST if request.method == "POST" else request.GET
    form = BulkForm(params)
    if not form.is_valid():
        return render(request, "console/bulk_preview.html", {"form": form, "invalid": True}, status=400)
    data = form.cleaned_data
    tasks, selection = _selection(request, params, data["target"])
    error = ""
    if request.method == "POST":
        try:
            operation = bulk.bulk_create(
                user=request.user,
                control=data["control"],
                reason=data["reason"],
                tasks=tasks,
                selection=selection,
                scope=data["scope"] or "task",
                escalate_to=data["escalate_to"] or "admin",
            )
        except bulk.BulkRefused as exc:
            error = str(exc)
        else:
            if operation.total <= bulk.sync_limit():
                bulk.bulk_run(operation.id, runner=f"console:{request.user.get_username()}")
            return redirect("console:bulk-report", operation_id=operation.id)
    full = params.get("count") == "full"
    budget = settings.BULK_COUNT_FOLLOWUP_MS if full else settings.BULK_COUNT_BUDGET_MS
    count = exact_count(tasks, budget_ms=budget)
    ceiling = bulk.max_tasks()
    context = {
        "form": form,
        "control": data["control"],
        "target": data["target"],
        "count": count,
        "counted": "" if count is None else f"{count:,}",
        # Not counted within the budget: the first page fills it in with a follow-up request; the
        # follow-up, past its own budget, says so.
        "counting": count is None and not full,
        "count_url": _count_url(params, data),
        "too_many": count is not None and count > ceiling,
        "ceiling": f"{ceiling:,}",
        "sample": list(tasks.select_related("tenant").defer("input", "outcome").order_by("-id")[:SAMPLE]),
        "hidden": _filter_fields(params),
        "error": error,
        "back": _back(params, selection),
        "runs_in_worker": count is None or count > bulk.sync_limit(),
    }
    return render(request, "console/bulk_preview.html", context, status=400 if error else 200)


def touched_tenants(operation_id: UUID) -> set[int]:
    """The tenants the operation covers: its snapshot's until a worker writes its results (one statement
    that deletes the snapshot as it writes them), then its results'. The snapshot is read first: read the
    other way round, a worker writing the results in between would leave neither."""
    waiting = BulkSnapshot.objects.filter(operation_id=operation_id).values_list("tenant_ids", flat=True)
    tenant_ids = waiting.first()
    if tenant_ids is not None:
        return {int(tenant_id) for tenant_id in tenant_ids}
    return set(
        BulkResult.objects.filter(operation_id=operation_id)
        .order_by()
        .values_list("tenant_id", flat=True)
        .distinct()
    )


def _operation_for(user: Any, operation_id: UUID) -> BulkOperation:
    """The operation if ``user`` started it, or may read every tenant it touched; else 404."""
    operation = BulkOperation.objects.filter(pk=operation_id).first()
    if operation is None:
        raise Http404("No such bulk operation")
    if operation.created_by_id != user.pk:
        touched = touched_tenants(operation.pk)
        if not touched or not touched <= set(tenant_ids_for(user, AUDIT_ROLES)):
            raise Http404("No such bulk operation")
    return operation


@login_required
def report(request: HttpRequest, operation_id: UUID) -> HttpResponse:
    operation = _operation_for(request.user, operation_id)
    shown = request.GET.get("outcome", "")
    results = operation.results.order_by("id")
    if shown in Outcome.values:
        results = results.filter(outcome=shown)
    context = {
        "operation": operation,
        "results": results[:RESULTS_SHOWN],
        "shown": shown,
        "outcomes": Outcome,
        "percent": (100 * operation.done // operation.total) if operation.total else 100,
        "limit": RESULTS_SHOWN,
    }
    return render(request, "console/bulk_report.html", context)


class _Within(Expression):
    """Whether a JSON array of tenant ids (``source``) is non-empty and holds only ids of ``allowed``."""

    output_field = BooleanField()

    def __init__(self, source: Any, allowed: set[int]) -> None:
        super().__init__()
        self.source = source
        self.allowed = sorted(int(tenant_id) for tenant_id in allowed)

    def get_source_expressions(self) -> list[Any]:
        return [self.source]

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        (self.source,) = exprs

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        column, params = compiler.compile(self.source)
        if connection.vendor == "postgresql":
            sql = f"(jsonb_array_length({column}) > 0 AND {column} <@ %s::jsonb)"
            return sql, (*params, *params, json.dumps(self.allowed))
        listed = ", ".join(["%s"] * len(self.allowed)) or "NULL"
        return (
            f"(json_array_length({column}) > 0 AND NOT EXISTS "
            f"(SELECT 1 FROM json_each({column}) AS held WHERE held.value NOT IN ({listed})))",
            (*params, *params, *self.allowed),
        )


def visible_operations(user: Any) -> QuerySet[BulkOperation]:
    """The operations whose report ``user`` may open (the rule of ``_operation_for``, as one query).

    Their own, or one whose every touched tenant is a tenant where they hold an audit role: the tenants of
    its results, or of its snapshot while no worker has written them (one statement reads both: a worker
    writing the results deletes the snapshot in the same commit, so it sees one or the other).
    """
    mine = Q(created_by_id=user.pk)
    audit_tenants = set(tenant_ids_for(user, AUDIT_ROLES))
    if not audit_tenants:
        return BulkOperation.objects.filter(mine)
    results = BulkResult.objects.filter(operation=OuterRef("pk"))
    readable = Exists(results) & ~Exists(results.exclude(tenant_id__in=audit_tenants))
    waiting = Exists(
        BulkSnapshot.objects.filter(operation=OuterRef("pk")).filter(_Within(F("tenant_ids"), audit_tenants))
    )
    return BulkOperation.objects.filter(mine | readable | waiting)


@login_required
def operations(request: HttpRequest) -> HttpResponse:
    """Past bulk operations, newest first (ids are UUIDv7: time ordered), keyset paged on ``before``."""
    found = visible_operations(request.user).defer("selection")
    page = keyset_page(found, NEWEST, request.GET.get(NEWEST.param), size=LIST_PAGE)
    context = {"operations": page.rows, "next_before": page.next_cursor, "first_page": page.first}
    return render(request, "console/bulk_list.html", context)
