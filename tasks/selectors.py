"""Read-side queries for the API and the console, scoped by tenant first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict
from uuid import UUID

import django_filters
from django.conf import settings
from django.db.models import Count, Exists, F, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone

from audit.models import TransitionEvent
from ledger.models import Action
from tasks import registry
from tasks.models import Lease, Task
from tasks.states import RUNNABLE, WAITING, ActorKind, State, edges_from, kinds_for_roles
from tenancy.selectors import roles_by_tenant, tenant_ids_for

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class TaskFilter(django_filters.FilterSet):
    """The queue's filters; one FilterSet serves the API and the console."""

    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    task_type = django_filters.ChoiceFilter(choices=lambda: [(n, n) for n in registry.names()])
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    stuck = django_filters.ChoiceFilter(choices=[("true", "yes"), ("false", "no")], method="filter_stuck")

    class Meta:
        model = Task
        fields = ["state", "task_type", "tenant", "stuck"]

    def filter_stuck(self, queryset: QuerySet[Task], name: str, value: str) -> QuerySet[Task]:
        condition = stuck_condition(timezone.now())
        return queryset.filter(condition) if value == "true" else queryset.exclude(condition)


def stuck_condition(now: datetime) -> Q:
    """Tasks with no valid next event coming: nobody will move them unless someone looks.

    - runnable, yet no worker has held a lease on it for ``STUCK_AFTER`` seconds;
    - a wait whose deadline passed ``STUCK_AFTER`` seconds ago and is still open
      (the sweep is not running);
    - an outcome unknown for longer than ``UNKNOWN_OUTCOME_ESCALATE_AFTER``.
    Waits before their deadline and quarantined tasks are owned states, not stuck.
    """
    grace = now - timedelta(seconds=settings.STUCK_AFTER)
    unattended = Q(state__in=sorted(RUNNABLE), state_entered_at__lt=grace) & ~Q(
        Exists(Lease.objects.filter(task_id=OuterRef("pk"), heartbeat_at__gt=grace))
    )
    overdue = Q(state__in=sorted(WAITING), wait_deadline__lt=grace)
    unknown = Q(
        state=State.OUTCOME_UNKNOWN,
        state_entered_at__lt=now - timedelta(seconds=settings.UNKNOWN_OUTCOME_ESCALATE_AFTER),
    )
    return unattended | overdue | unknown


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


def _quarantined(tenant_ids: list[int]) -> QuerySet[WithAnnotations[Task, _Quarantine]]:
    entry = _quarantine_entry()
    return Task.objects.filter(tenant_id__in=tenant_ids, state=State.QUARANTINED).annotate(
        # A history gone with retention falls back to the task's own reason.
        quarantine_code=Coalesce(Subquery(entry.values("reason_code")[:1]), F("state_reason")),
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
