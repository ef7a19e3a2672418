"""Read-side queries for the API and the console, scoped by tenant first."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import django_filters
from django.conf import settings
from django.db.models import Count, Exists, OuterRef, Q
from django.http import Http404
from django.utils import timezone

from ledger.models import Action
from tasks import registry
from tasks.models import Lease, Task
from tasks.states import RUNNABLE, WAITING, ActorKind, State, edges_from, kinds_for_roles
from tenancy.selectors import roles_by_tenant, tenant_ids_for


class TaskFilter(django_filters.FilterSet):
    """The queue's filters; one FilterSet serves the API and the console."""

    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    task_type = django_filters.ChoiceFilter(choices=lambda: [(n, n) for n in registry.names()])
    tenant = django_filters.CharFilter(field_name="tenant__slug")
    stuck = django_filters.ChoiceFilter(choices=[("true", "yes"), ("false", "no")], method="filter_stuck")

    class Meta:
        model = Task
        fields = ["state", "task_type", "tenant", "stuck"]

    def filter_stuck(self, queryset, name, value):
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


def visible_tasks(user: Any):
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
