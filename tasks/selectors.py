"""Read-side queries for the API and the console, scoped by tenant first."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict
from uuid import UUID

import django_filters
from django import forms
from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet, Subquery, TextField
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone

from audit.models import TransitionEvent
from ledger.models import Action
from tasks import registry
from tasks.models import Lease, Task
from tasks.states import (
    NON_TERMINAL,
    RUNNABLE,
    TERMINAL,
    WAITING,
    ActorKind,
    State,
    edges_from,
    kinds_for_roles,
)
from tenancy.selectors import roles_by_tenant, tenant_ids_for, tenants_for

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


# The queue's search document: id (hex, no dashes), objective, idempotency key and the input
# as JSON text. Written as portable SQL (PostgreSQL and SQLite). On PostgreSQL the
# ``task_search_trgm`` trigram GIN index (tasks migration 0005) is built on ``UPPER(<this>)``
# — the exact expression Django's ``icontains`` compares — so a search is a bitmap index
# scan at any table size; keep the two texts identical (``test_queue`` checks the plan).
# On SQLite (the demo) the same filter is a full scan of the user's tenants.
SEARCH_SQL = (
    "REPLACE(CAST(\"tasks_task\".\"id\" AS text), '-', '')"
    ' || \' \' || "tasks_task"."objective"'
    " || ' ' || COALESCE(\"tasks_task\".\"idempotency_key\", '')"
    ' || \' \' || CAST("tasks_task"."input" AS text)'
)
FINISHED = "finished"  # state_counts: the terminal states counted together
SEARCH_MIN = 3  # a trigram index cannot narrow a shorter term
_HEX_ID = re.compile(r"^[0-9a-f]{4,32}$")
AGES = {
    "5m": timedelta(minutes=5),
    "1h": timedelta(hours=1),
    "1d": timedelta(days=1),
    "7d": timedelta(days=7),
}
YES_NO = [("true", "yes"), ("false", "no")]


def search_condition(term: str) -> Q:
    """Tasks whose id starts with ``term`` or whose search document contains it (any case).

    An id prefix is a range on the primary key (its index); everything else goes through
    the search document. Both halves are index scans on PostgreSQL, OR-ed as a BitmapOr.
    """
    term = term.strip()
    condition = Q(search_doc__icontains=term)
    hex_id = term.lower().replace("-", "")
    if _HEX_ID.match(hex_id):
        lowest, highest = UUID(hex_id.ljust(32, "0")), UUID(hex_id.ljust(32, "f"))
        condition |= Q(id__gte=lowest, id__lte=highest)
        if hex_id != term.lower():  # pasted with dashes: the document holds the id without them
            condition |= Q(search_doc__icontains=hex_id)
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
    # Quarantined for this reason code, as the triage page groups them (see ``_quarantine_code``).
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
        return queryset.annotate(search_doc=RawSQL(SEARCH_SQL, (), output_field=TextField())).filter(
            search_condition(value)
        )

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
        held = queryset.filter(state=State.QUARANTINED).annotate(quarantine_code=_quarantine_code())
        return held.filter(quarantine_code=value.strip())


def state_counts(tenant_ids: list[int], *, cap: int) -> dict[str, int]:
    """Counts for the queue's summary bar, each capped: one query whose cost does not grow with the table.

    Every non-terminal state, and the terminal ones together under ``"finished"``, is
    counted by a subquery that stops at ``cap + 1`` index entries (``LIMIT``), so a
    million tasks in one state cost what a thousand do. The subqueries are joined by
    ``UNION ALL`` into one round trip; the SQL is the ORM's own, so it runs on SQLite too.
    A value above ``cap`` means "more than cap". States with no tasks are left out.
    """
    groups: list[tuple[str, Sequence[str]]] = [(state, [state]) for state in sorted(NON_TERMINAL)]
    groups.append((FINISHED, sorted(TERMINAL)))
    parts, params = [], []
    for label, states in groups:
        capped = Task.objects.filter(tenant_id__in=tenant_ids, state__in=states).values("id")[: cap + 1]
        sql, capped_params = capped.query.sql_with_params()
        parts.append(f"SELECT %s, (SELECT COUNT(*) FROM ({sql}) capped)")
        params.extend([label, *capped_params])
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(parts), params)
        return {label: n for label, n in cursor.fetchall() if n}


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


def stuck_condition(now: datetime) -> Q:
    """Tasks with no valid next event coming: nobody will move them unless someone looks.

    - runnable, yet no worker has held a lease on it for ``STUCK_AFTER`` seconds;
    - a wait whose deadline passed ``STUCK_AFTER`` seconds ago and is still open
      (the sweep is not running);
    - an outcome unknown for longer than ``UNKNOWN_OUTCOME_ESCALATE_AFTER``.
    Waits before their deadline and quarantined tasks are owned states, not stuck.
    Each clause is its own function: ``runtime.alerts`` raises one kind of alert per clause.
    """
    return unattended_condition(now) | overdue_wait_condition(now) | unknown_overdue_condition(now)


def unattended_condition(now: datetime) -> Q:
    """Runnable since over ``STUCK_AFTER`` seconds, and no lease heartbeat in that time."""
    grace = now - timedelta(seconds=settings.STUCK_AFTER)
    return Q(state__in=sorted(RUNNABLE), state_entered_at__lt=grace) & ~Q(
        Exists(Lease.objects.filter(task_id=OuterRef("pk"), heartbeat_at__gt=grace))
    )


def overdue_wait_condition(now: datetime) -> Q:
    """A wait whose deadline passed over ``STUCK_AFTER`` seconds ago (the sweep ends waits at deadlines)."""
    return Q(state__in=sorted(WAITING), wait_deadline__lt=now - timedelta(seconds=settings.STUCK_AFTER))


def unknown_overdue_condition(now: datetime) -> Q:
    """``outcome_unknown`` for longer than ``UNKNOWN_OUTCOME_ESCALATE_AFTER`` seconds."""
    return Q(
        state=State.OUTCOME_UNKNOWN,
        state_entered_at__lt=now - timedelta(seconds=settings.UNKNOWN_OUTCOME_ESCALATE_AFTER),
    )


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks in every tenant where ``user`` holds any role."""
    return Task.objects.filter(tenant_id__in=tenant_ids_for(user))


def get_visible_task(user: Any, task_id: UUID | str) -> Task:
    """The task, or ``Http404`` — also for another tenant's task, so ids leak nothing."""
    task = visible_tasks(user).select_related("tenant", "owner").filter(pk=task_id).first()
    if task is None:
        raise Http404("No such task")
    return task


def roles_in(user: Any, task: Task) -> frozenset[str]:
    return roles_by_tenant(user).get(task.tenant_id, frozenset())


def allowed_moves(user: Any, task: Task) -> list[dict[str, str]]:
    """Edges the caller could take from the task's current state (read from the table)."""
    kinds: frozenset[ActorKind] = kinds_for_roles(roles_in(user, task))
    return [
        {"trigger": edge.trigger, "to_state": edge.target} for edge in edges_from(task.state, kinds=kinds)
    ]


def ledger_summary(task: Task) -> dict[str, int]:
    rows = Action.objects.filter(task=task).values("dispatch_state").annotate(n=Count("id"))
    return {row["dispatch_state"]: row["n"] for row in rows}


# --- Quarantine triage -------------------------------------------------------


class _Quarantine(TypedDict):
    quarantine_code: str
    quarantine_reason: str | None
    quarantined_by: str | None


def _quarantine_entry() -> QuerySet[TransitionEvent]:
    """The event that put the task into quarantine (its newest entry into the state).

    Not ``Task.state_reason`` alone: an escalation while quarantined is a
    self-loop that rewrites ``state_reason`` to ``escalate``, and the triage
    list must still say why the task was held. Read newest-first on the
    ``event_one_per_version`` index, one row per task.
    """
    return (
        TransitionEvent.objects.filter(task_id=OuterRef("pk"), to_state=State.QUARANTINED)
        .exclude(from_state=State.QUARANTINED)
        .order_by("-state_version")
    )


def _quarantine_code() -> Coalesce:
    """Why the task was quarantined; a history gone with retention falls back to the task's own reason."""
    return Coalesce(Subquery(_quarantine_entry().values("reason_code")[:1]), F("state_reason"))


def _quarantined(tenant_ids: list[int]) -> QuerySet[WithAnnotations[Task, _Quarantine]]:
    entry = _quarantine_entry()
    return Task.objects.filter(tenant_id__in=tenant_ids, state=State.QUARANTINED).annotate(
        quarantine_code=_quarantine_code(),
        quarantine_reason=Subquery(entry.values("reason")[:1]),
        quarantined_by=Subquery(entry.values("actor_id")[:1]),
    )


def quarantine_counts(tenant_ids: list[int]) -> list[dict[str, Any]]:
    """Quarantined tasks per reason code, most first: one GROUP BY query.

    Each row: ``code``, ``n``, ``oldest`` (the earliest ``state_entered_at``).
    Uses the ``task_tenant_state_id`` index for the tenant and state.
    """
    rows = (
        _quarantined(tenant_ids)
        .values("quarantine_code")
        .annotate(n=Count("id"), oldest=Min("state_entered_at"))
        .order_by("-n", "quarantine_code")
    )
    return [{"code": row["quarantine_code"], "n": row["n"], "oldest": row["oldest"]} for row in rows]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class QuarantineCursor:
    """After this (state_entered_at, id): the list runs longest-held first."""

    entered_at: datetime
    id: UUID

    def __str__(self) -> str:
        return f"{(self.entered_at - _EPOCH) // timedelta(microseconds=1)}_{self.id}"

    @classmethod
    def parse(cls, text: str | None) -> QuarantineCursor | None:
        micros, _, task_id = (text or "").partition("_")
        try:
            return cls(_EPOCH + timedelta(microseconds=int(micros)), UUID(task_id))
        except (ValueError, OverflowError):
            return None


@dataclass(frozen=True)
class QuarantinePage:
    tasks: Sequence[Task]
    next_cursor: QuarantineCursor | None


def quarantined_tasks(
    tenant_ids: list[int], *, code: str, after: QuarantineCursor | None, limit: int
) -> QuarantinePage:
    """One page of the tasks held for ``code``, longest in quarantine first. One query.

    Each task carries ``quarantine_code``, ``quarantine_reason`` (the human
    reason of the event that quarantined it) and ``quarantined_by``, and its tenant.
    """
    tasks = _quarantined(tenant_ids).filter(quarantine_code=code)
    if after is not None:
        tasks = tasks.filter(
            Q(state_entered_at__gt=after.entered_at) | Q(state_entered_at=after.entered_at, id__gt=after.id)
        )
    rows = list(
        tasks.select_related("tenant")
        .defer("input", "outcome")  # large JSON the list never shows
        .order_by("state_entered_at", "id")[: limit + 1]
    )
    more = len(rows) > limit
    last = rows[limit - 1] if more else None
    return QuarantinePage(
        rows[:limit], QuarantineCursor(last.state_entered_at, last.id) if last is not None else None
    )
