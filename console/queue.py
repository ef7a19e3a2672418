"""The queue's paging, summary and CSV export (the page itself is ``console.views.queue``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponseBadRequest, QueryDict, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.utils import timezone

from audit import export
from console.paging import Keyset, merged_keyset_page
from reads import queue, visibility
from tasks.models import Task
from tasks.states import State
from tenancy.models import Tenant
from tenancy.selectors import tenant_ids_for

SORTS = {"newest": "Newest first", "age": "Longest in state first"}
COUNT_CAP = 1_000  # each count in the summary bar stops here ("1000+")
EXPORT_CHUNK = 1000
EXPORT_COLUMNS = [
    "id", "tenant", "task_type", "state", "state_version", "state_reason", "region",
    "escalation_level", "escalated_to", "objective", "idempotency_key", "created_at", "state_entered_at",
]  # fmt: skip


def filtered(request: HttpRequest, params: QueryDict) -> tuple[queue.TaskFilter, QuerySet[Task], list[int]]:
    """The user's tasks narrowed by the filters in ``params`` (a filter with errors narrows nothing), and
    the tenants they are in, to read one at a time (``page``): ``?tenant=`` naming a tenant the user does
    not hold finds nothing without reading a task."""
    visible = visibility.visible_tasks(request.user)
    filters = queue.TaskFilter(params, queryset=visible, request=request)
    if not filters.is_valid():
        return filters, visible.none(), []
    held = tenant_ids_for(request.user)
    slug = filters.form.cleaned_data.get("tenant") or ""
    if slug:
        held = list(Tenant.objects.filter(id__in=held, slug=slug).values_list("id", flat=True))
        if not held:
            return filters, visible.none(), []
    return filters, filters.qs, held


@dataclass(frozen=True)
class QueuePage:
    tasks: Sequence[Task]
    next_query: str  # the link to the next page ("" on the last)
    sort: str


# The queue's two orders: ``newest`` walks ``-id`` (index ``task_tenant_id``), ``age`` walks
# ``(state_entered_at, id)`` ascending (index ``task_tenant_entered``).
KEYSETS = {
    "newest": Keyset("before", ("-id",), (UUID,)),
    "age": Keyset("after", ("state_entered_at", "id"), (datetime, UUID)),
}


def page(tasks: QuerySet[Task], params: QueryDict, *, size: int, tenants: Sequence[int] = ()) -> QueuePage:
    """One keyset page in the chosen order (``KEYSETS``), read one tenant at a time when ``tenants``
    names several (``merged_keyset_page``): one query a tenant whatever the table's size."""
    sort = params.get("sort") or "newest"
    sort = sort if sort in SORTS else "newest"
    keyset = KEYSETS[sort]
    rows = queue.queue_rows(tasks)
    parts = [rows.filter(tenant_id=tenant) for tenant in tenants] or [rows]
    found = merged_keyset_page(parts, keyset, params.get(keyset.param), size=size)
    next_query = ""
    if found.next_cursor:
        rest = params.copy()
        for other in KEYSETS.values():
            rest.pop(other.param, None)
        rest[keyset.param] = found.next_cursor
        next_query = rest.urlencode()
    return QueuePage(found.rows, next_query, sort)


def summary(request: HttpRequest) -> dict[str, Any]:
    """Each state's count, exact: counted live up to ``COUNT_CAP``; past it the maintained rollup's
    count (``runtime.rollups``, recounted every ``ROLLUP_INTERVAL`` s) with the time it was counted
    (``as_of``); before any recount, "about N" from PostgreSQL's statistics
    (``queue.estimated_counts``), or "1,000+" where there are none."""
    tenant_ids = tenant_ids_for(request.user)
    counts = queue.state_counts(tenant_ids, cap=COUNT_CAP)
    over = [label for label, n in counts.items() if n > COUNT_CAP]
    maintained = queue.maintained_counts(tenant_ids, over)
    counted = {label: found for label, found in maintained.items() if found.n > COUNT_CAP}
    estimates = queue.estimated_counts(tenant_ids, [label for label in over if label not in counted])

    def shown(label: str) -> str:
        n = counts.get(label, 0)
        if n <= COUNT_CAP:
            return f"{n:,}"
        if label in counted:
            return f"{counted[label].n:,}"
        estimate = estimates.get(label, 0)
        return f"about {_rounded(estimate):,}" if estimate > COUNT_CAP else f"{COUNT_CAP:,}+"

    rows = [(value, label, shown(value)) for value, label in State.choices if value in counts]
    as_of = min((found.counted_at for found in counted.values()), default=None)
    return {
        "live": rows,
        "finished": shown(queue.FINISHED),
        "cap": f"{COUNT_CAP:,}",
        "as_of": None if as_of is None else timezone.localtime(as_of),
    }


def _rounded(n: int) -> int:
    """``n`` to two significant digits (233,114: 230,000): an estimate says no more than it knows."""
    scale = 10 ** max(len(str(n)) - 2, 0)
    return int(round(n / scale) * scale)


def _csv_row(task: Task) -> list[Any]:
    return [
        task.id, task.tenant.slug, task.task_type, task.state, task.state_version, task.state_reason,
        task.region, task.escalation_level, task.escalated_to, task.objective, task.idempotency_key,
        task.created_at.isoformat(), task.state_entered_at.isoformat(),
    ]  # fmt: skip


def _csv_rows(tasks: QuerySet[Task], tenants: Sequence[int]) -> Iterator[str]:
    """Newest first, each tenant read by its own keyset chunks and the streams merged as they go."""
    rows = queue.merged_newest_first(
        [tasks.filter(tenant_id=tenant) for tenant in tenants], size=EXPORT_CHUNK
    )
    return export.stream_rows(EXPORT_COLUMNS, (_csv_row(task) for task in rows))


@login_required
def export_csv(request: HttpRequest) -> HttpResponseBase:
    """The filtered queue as CSV, streamed: one keyset query per ``EXPORT_CHUNK`` rows, newest first."""
    filters, tasks, tenants = filtered(request, request.GET)
    if not filters.is_valid():
        return HttpResponseBadRequest(f"Bad filter: {dict(filters.errors)}")
    rows = _csv_rows(tasks.select_related("tenant").defer("input", "outcome"), tenants)
    response = StreamingHttpResponse(rows, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="tasks-{stamp}.csv"'
    return response
