"""Read-side queries for the API and the console, scoped by tenant first."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import django_filters
from django.db.models import Count
from django.http import Http404

from ledger.models import Action
from tasks import registry
from tasks.models import Task
from tasks.states import ActorKind, State, edges_from, kinds_for_roles
from tenancy.selectors import roles_by_tenant, tenant_ids_for


class TaskFilter(django_filters.FilterSet):
    """The queue's filters; one FilterSet serves the API and the console."""

    state = django_filters.MultipleChoiceFilter(choices=State.choices)
    task_type = django_filters.ChoiceFilter(choices=lambda: [(n, n) for n in registry.names()])
    tenant = django_filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = Task
        fields = ["state", "task_type", "tenant"]


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
