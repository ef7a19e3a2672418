"""Who may see and act on what in the console (tenant scoped, like the API)."""

from __future__ import annotations

from typing import Any

from tasks import selectors
from tasks.models import Task
from tenancy.models import Role


def get_task_for_user(user: Any, task_id) -> Task:
    """The task if ``user`` holds any role in its tenant; ``Http404`` otherwise."""
    return selectors.get_visible_task(user, task_id)


def can_operate(user: Any, task: Task) -> bool:
    return bool(selectors.roles_in(user, task) & {Role.OPERATOR, Role.ADMIN})
