"""Who may see and act on what in the console (tenant scoped, like the API)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.core.exceptions import PermissionDenied

from reads import visibility
from tasks.models import Task
from tasks.selectors import roles_in
from tenancy.models import Role
from tenancy.selectors import has_role, tenant_ids_for

# Who reads the audit log (search, history, export). Not approvers: an approver
# decides requests and sees each task's timeline on its task page, but searching
# and exporting everyone's history (their own decisions included) is the
# auditor's separation of duties; operators and admins need it to investigate.
AUDIT_ROLES = (Role.AUDITOR, Role.OPERATOR, Role.ADMIN)
# Who sees the quarantine triage list: operators and admins act on it (on the task
# page); auditors read it. Approvers have their own inbox.
QUARANTINE_ROLES = (Role.OPERATOR, Role.ADMIN, Role.AUDITOR)


def get_task_for_user(user: Any, task_id: UUID | str) -> Task:
    """The task if ``user`` holds any role in its tenant; ``Http404`` otherwise."""
    return visibility.get_visible_task(user, task_id)


def can_operate(user: Any, task: Task) -> bool:
    return bool(roles_in(user, task) & {Role.OPERATOR, Role.ADMIN})


def tenant_ids_or_403(user: Any, roles: tuple[str, ...]) -> list[int]:
    """The tenants where ``user`` holds one of ``roles``; ``PermissionDenied`` if there are none."""
    tenant_ids = tenant_ids_for(user, roles)
    if not tenant_ids:
        raise PermissionDenied
    return tenant_ids


def get_task_for_auditing(user: Any, task_id: UUID | str) -> Task:
    """The task if ``user`` may read its audit history.

    ``Http404`` outside the user's tenants (ids leak nothing); ``PermissionDenied``
    for a task the user may see but holds no audit role for (an approver).
    """
    task = get_task_for_user(user, task_id)
    if not has_role(user, task.tenant_id, *AUDIT_ROLES):
        raise PermissionDenied
    return task
