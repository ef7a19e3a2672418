"""Which tasks a user sees, and what they may do with one: the first read of every task endpoint and page."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import QuerySet
from django.http import Http404

from tasks.models import Task
from tasks.selectors import roles_in
from tasks.states import ActorKind, edges_from, kinds_for_roles
from tenancy.selectors import tenant_ids_for


def visible_tasks(user: Any) -> QuerySet[Task]:
    """Tasks in every tenant where ``user`` holds any role."""
    return Task.objects.filter(tenant_id__in=tenant_ids_for(user))


def get_visible_task(user: Any, task_id: UUID | str) -> Task:
    """The task, or ``Http404`` — also for another tenant's task, so ids leak nothing."""
    task = visible_tasks(user).select_related("tenant", "owner").filter(pk=task_id).first()
    if task is None:
        raise Http404("No such task")
    return task


def allowed_moves(user: Any, task: Task) -> list[dict[str, str]]:
    """Edges the caller could take from the task's current state (read from the table)."""
    kinds: frozenset[ActorKind] = kinds_for_roles(roles_in(user, task))
    return [
        {"trigger": edge.trigger, "to_state": edge.target} for edge in edges_from(task.state, kinds=kinds)
    ]
