"""The queue's reads: its filters (one FilterSet for the API and the console), its summary bar,
its search document, its rows and the chunks of its CSV export. Scoped by tenant first."""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import django_filters
from django import forms
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import BooleanField, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from reads.quarantine import quarantine_code
from runtime import rollups
from tasks import registry
from tasks.leases import live_lease_exists
from tasks.models import Task
from tasks.selectors import stuck_condition
from tasks.states import NON_TERMINAL, TERMINAL, State
from tenancy.selectors import tenants_for

# The queue's search document: id (hex, no dashes), objective, idempotency key and the input as JSON
# text. On PostgreSQL it is a row of its own (``tasks.models.TaskSearch``, written by triggers, tasks
# migration 0017, with the same expression), whose trigram GIN index ``task_search_doc_trgm`` on
# ``UPPER(doc)`` makes a search an index scan at any table size (``test_queue`` checks the plan). On
# SQLite (the demo) it is this expression over the task's own row, and the filter a full scan of the
# user's tenants.
SEARCH_SQL = (
    "REPLACE(CAST(\"tasks_task\".\"id\" AS text), '-', '')"
    ' || \' \' || "tasks_task"."objective"'
    " || ' ' || COALESCE(\"tasks_task\".\"idempotency_key\", '')"
    ' || \' \' || CAST("tasks_task"."input" AS text)'
)
FINISHED = "finished"  # state_counts: the terminal states counted together
SEARCH_MIN = 3  # a trigram index cannot narrow a shorter term
ID_CANDIDATES = 20_000  # search_condition: at most this many matches of a term that could start an id
_HEX_ID = re.compile(r"^[0-9a-f]{4,32}$")
AGES = {
    "5m": timedelta(minutes=5),
    "1h": timedelta(hours=1),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}
YES_NO = [("true", "yes"), ("false", "no")]


def _id_range(term: str) -> tuple[UUID, UUID] | None:
    """The ids that start with ``term`` (hex, dashes allowed), or None when it cannot start one."""
    hex_id = term.lower().replace("-", "")
    if not _HEX_ID.match(hex_id):
        return None
    return UUID(hex_id.ljust(32, "0")), UUID(hex_id.ljust(32, "f"))


def search_condition(term: str, vendor: str = "postgresql", using: str = DEFAULT_DB_ALIAS) -> Q:
    """Tasks whose id starts with ``term`` or whose search document contains it (any case).

    An id prefix is a range on the primary key; a pasted id with dashes is also looked for without
    them, as the document holds it. On PostgreSQL the documents are rows of ``tasks_task_search``;
    elsewhere each is computed from its task (``SEARCH_SQL``). A term that could start an id is
    looked up first (``ID_CANDIDATES``) on the database ``using``.
    """
    term = term.strip()
    hex_id = term.lower().replace("-", "")
    ids = _id_range(term)
    patterns = [term] + ([hex_id] if ids and hex_id != term.lower() else [])
    if vendor == "postgresql":
        # One subquery, so that PostgreSQL joins the few tasks it finds (the trigram index of the
        # search table, a range of the key) rather than testing every task of the tenant on an OR.
        parts = ["SELECT task_id FROM tasks_task_search WHERE UPPER(doc) LIKE UPPER(%s)"] * len(patterns)
        params: list[Any] = [f"%{connection.ops.prep_for_like_query(each)}%" for each in patterns]
        if ids:
            parts.append("SELECT id FROM tasks_task WHERE id BETWEEN %s AND %s")
            params += ids
        found = " UNION ALL ".join(parts)
        if ids:
            # An id's head (uuid7's time) is shared by every task created in the same ~65 s, thousands
            # in one range of the key, which the newest-first walk of a tenant's index meets only once
            # past every newer task (at 1M: 1.4-2.7 s, a merge join over the whole tenant). Up to
            # ID_CANDIDATES matches are fetched first and the page looks them up by key; past that
            # many the matches are dense and the walk finds a page soon.
            with connections[using].cursor() as cursor:
                cursor.execute(
                    f"SELECT DISTINCT task_id FROM ({found}) found LIMIT %s", [*params, ID_CANDIDATES + 1]
                )
                matched = [row[0] for row in cursor.fetchall()]
            if len(matched) <= ID_CANDIDATES:  # one array parameter, not thousands
                return Q(
                    RawSQL('"tasks_task"."id" = ANY(%s::uuid[])', (matched,), output_field=BooleanField())
                )
        return Q(id__in=RawSQL(found, params))
    condition = Q()
    for each in patterns:
        condition |= Q(search_doc__icontains=each)
    if ids:
        condition |= Q(id__gte=ids[0], id__lte=ids[1])
    return condition


class TaskFilter(django_filters.FilterSet):
    """The queue's filters; one FilterSet serves the API and the console.

    Pass ``request``: the tenant choices are the requesting user's tenants.
    """

    q = django_filters.CharFilter(
        method="filter_search", min_length=SEARCH_MIN, max_length=200, label="Search"
    )
    # distinct=False: no join here can repeat a row, and SELECT DISTINCT would read and
    # de-duplicate every task in the chosen states before the page's LIMIT (9x at 100k).
    state = django_filters.MultipleChoiceFilter(choices=State.choices, distinct=False)
    task_type = django_filters.ChoiceFilter(
        choices=lambda: [(n, n) for n in registry.names()], label="Task type"
    )
    # Free text (another tenant's slug finds nothing, like the API always answered), shown as a select.
    tenant = django_filters.CharFilter(field_name="tenant__slug", max_length=50)
    region = django_filters.CharFilter(max_length=32)
    escalated = django_filters.ChoiceFilter(choices=YES_NO, method="filter_escalated")
    stuck = django_filters.ChoiceFilter(choices=YES_NO, method="filter_stuck")
    reason = django_filters.CharFilter(max_length=64, method="filter_reason", label="Outcome reason")
    age = django_filters.ChoiceFilter(
        choices=[(key, f"over {key}") for key in AGES], method="filter_age", label="In state"
    )
    # Quarantined for this reason code, as the triage page groups them (``quarantine_code``).
    held = django_filters.CharFilter(max_length=64, method="filter_held", label="Quarantined for")

    class Meta:
        model = Task
        fields = [
            "q",
            "state",
            "task_type",
            "tenant",
            "region",
            "escalated",
            "stuck",
            "reason",
            "age",
            "held",
        ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        user = getattr(self.request, "user", None)
        if user is not None:
            slugs = tenants_for(user).values_list("slug", flat=True)
            choices = [("", "any"), *((slug, slug) for slug in slugs)]
            self.filters["tenant"].extra["widget"] = forms.Select(choices=choices)

    def filter_search(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        if not value:
            return queryset
        vendor = connections[queryset.db].vendor
        if vendor != "postgresql":
            queryset = queryset.annotate(search_doc=RawSQL(SEARCH_SQL, (), output_field=TextField()))
        return queryset.filter(search_condition(value, vendor, queryset.db))

    def filter_escalated(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        return (
            queryset.filter(escalation_level__gt=0)
            if value == "true"
            else queryset.filter(escalation_level=0)
        )

    def filter_stuck(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        condition = stuck_condition(timezone.now())
        return queryset.filter(condition) if value == "true" else queryset.exclude(condition)

    def filter_reason(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        """The machine reason of the state (``cancel`` finds ``cancel:task`` too) or of the outcome."""
        value = value.strip()
        return queryset.filter(
            Q(state_reason=value) | Q(state_reason__startswith=f"{value}:") | Q(outcome__reason=value)
        )

    def filter_age(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        return queryset.filter(state_entered_at__lt=timezone.now() - AGES[value])

    def filter_held(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        held = queryset.filter(state=State.QUARANTINED).annotate(quarantine_code=quarantine_code())
        return held.filter(quarantine_code=value.strip())


def count_groups() -> list[tuple[str, Sequence[str]]]:
    """The summary's labels and the states each counts: every non-terminal state, the terminal ones
    together under ``FINISHED``."""
    groups: list[tuple[str, Sequence[str]]] = [(state, [state]) for state in sorted(NON_TERMINAL)]
    groups.append((FINISHED, sorted(TERMINAL)))
    return groups


def maintained_counts(tenant_ids: list[int], labels: Sequence[str]) -> dict[str, rollups.Counted]:
    """The exact counts of ``labels`` (a state, or ``FINISHED``) at the last recount of the maintained
    rollup (``runtime.rollups``), with when that was; nothing before the first recount."""
    if not labels:
        return {}
    wanted = set(labels)
    return rollups.state_counts(tenant_ids, [group for group in count_groups() if group[0] in wanted])


def state_counts(tenant_ids: list[int], *, cap: int) -> dict[str, int]:
    """Counts for the queue's summary bar, each capped: one query whose cost does not grow with the table.

    Every non-terminal state, and the terminal ones together under ``"finished"``, is
    counted by a subquery that stops at ``cap + 1`` index entries (``LIMIT``), so a
    million tasks in one state cost what a thousand do. The subqueries are joined by
    ``UNION ALL`` into one round trip; the SQL is the ORM's own, so it runs on SQLite too.
    A value above ``cap`` means "more than cap". States with no tasks are left out.
    """
    parts, params = [], []
    for label, states in count_groups():
        capped = Task.objects.filter(tenant_id__in=tenant_ids, state__in=states).values("id")[: cap + 1]
        sql, capped_params = capped.query.sql_with_params()
        parts.append(f"SELECT %s, (SELECT COUNT(*) FROM ({sql}) capped)")
        params.extend([label, *capped_params])
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        return {label: n for label, n in cursor.fetchall() if n}


def estimated_counts(tenant_ids: list[int], labels: Sequence[str]) -> dict[str, int]:
    """PostgreSQL's estimate of the tasks in each of ``labels`` (a state, or ``FINISHED``), for counts past
    the summary's cap: the planner's row estimate from the statistics autovacuum's ``ANALYZE`` keeps
    (one ``EXPLAIN`` of every label's query joined by ``UNION ALL``, each arm's estimate read off the
    ``Append``; no task read). Nothing on another database or before the table was ever analyzed: no
    statistics, no estimate."""
    if not labels or connection.vendor != "postgresql":
        return {}
    arms = [
        Task.objects.filter(
            tenant_id__in=tenant_ids, state__in=sorted(TERMINAL) if label == FINISHED else [label]
        )
        .values("id")
        .query.sql_with_params()
        for label in labels
    ]
    with connection.cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [Task._meta.db_table])
        row = cursor.fetchone()
        if row is None or row[0] < 0:
            return {}
        rows = _arms_rows(cursor, arms)
        if rows is None:  # not one Append of the arms (a parallel plan's arms are per worker): one each
            rows = [_plan(cursor, sql, params)["Plan Rows"] for sql, params in arms]
        return {label: int(n) for label, n in zip(labels, rows, strict=True)}


def _plan(cursor: Any, sql: str, params: Sequence[Any]) -> dict[str, Any]:
    """The top node of ``EXPLAIN (FORMAT JSON)`` of ``sql``."""
    cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
    plan = cursor.fetchone()[0]
    top: dict[str, Any] = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return top


def _arms_rows(cursor: Any, arms: Sequence[tuple[str, Sequence[Any]]]) -> list[int] | None:
    """The planner's row estimate of each of ``arms`` (SQL, params) from one ``EXPLAIN`` of them joined
    by ``UNION ALL``; None unless that plan is the arms side by side under one ``Append``."""
    top = _plan(
        cursor,
        " UNION ALL ".join(f"({sql})" for sql, _ in arms),
        [param for _, params in arms for param in params],
    )
    if len(arms) == 1:
        return [int(top["Plan Rows"])]
    children = top.get("Plans", [])
    if top["Node Type"] != "Append" or len(children) != len(arms):
        return None
    return [int(child["Plan Rows"]) for child in children]


def queue_rows(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """``tasks`` as queue rows, the one read of the console's queue and ``GET /api/tasks/``.

    Each row comes with its tenant (joined: one query a page) and ``leased`` (a live worker holds
    its lease: the queue tells an *active* ready task from an *eligible* one), without the large
    JSON columns no list shows. Order and page it as the surface does; nothing is read per row.
    """
    rows = tasks.select_related("tenant").defer("input", "outcome")
    return rows.annotate(leased=live_lease_exists(timezone.now()))


def keyset_chunks(tasks: QuerySet[Task], *, size: int) -> Iterator[list[Task]]:
    """``tasks`` newest first in chunks of ``size``: one query per chunk, each an index range on -id."""
    before: UUID | None = None
    while True:
        page = tasks.filter(id__lt=before) if before is not None else tasks
        chunk = list(page.order_by("-id")[:size])
        if chunk:
            yield chunk
        if len(chunk) < size:
            return
        before = chunk[-1].id


def merged_newest_first(parts: Sequence[QuerySet[Task]], *, size: int) -> Iterator[Task]:
    """The tasks of every part (disjoint: one per tenant) newest first, as one query over their union
    would give them: each part walked by ``keyset_chunks`` (an index range on its tenant's -id) and the
    streams merged lazily, so the first rows come after one chunk per part, whatever the tables hold."""
    streams = [(task for chunk in keyset_chunks(part, size=size) for task in chunk) for part in parts]
    return heapq.merge(*streams, key=lambda task: task.id, reverse=True)
