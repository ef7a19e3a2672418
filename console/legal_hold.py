"""The task page's legal hold: tenant admins place or lift it, everyone of the tenant sees it.

While a hold is in force retention neither archives nor deletes the task (``protection.holds``).
The panel (``{% legal_hold_panel %}``, ``console.templatetags.legal_hold``) shows the hold, its
history and the archive date; its form posts here. The hold rows are the record of who placed or
lifted one and why; the API twin is ``/api/tasks/{id}/legal-hold/``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_POST

from console.access import get_task_for_user
from console.forms import ConsoleForm
from console.posting import Done, Refusal, form_post
from protection.holds import set_legal_hold
from tasks import selectors
from tasks.exceptions import TaskNotFound
from tasks.models import Task
from tenancy.models import Role


class LegalHoldForm(ConsoleForm):
    hold = forms.TypedChoiceField(
        choices=[("place", "Place a legal hold"), ("lift", "Lift the legal hold")],
        coerce=lambda value: value == "place",
        widget=forms.HiddenInput,
    )
    reason = forms.CharField(max_length=500, label="Reason")

    def problem(self) -> str:
        return "A reason is required (up to 500 characters): the hold is unchanged."


def may_hold(user: Any, task: Task) -> bool:
    """Tenant admins place and lift legal holds."""
    return Role.ADMIN in selectors.roles_in(user, task)


@login_required
@require_POST
def task_legal_hold(request: HttpRequest, task_id: UUID) -> HttpResponse:
    task = get_task_for_user(request.user, task_id)
    if not may_hold(request.user, task):
        raise PermissionDenied

    def act(data: dict[str, Any]) -> Done:
        hold = data["hold"]
        if set_legal_hold(task, hold=hold, by=request.user.get_username(), reason=data["reason"]):
            return Done("Legal hold placed." if hold else "Legal hold lifted.")
        return Done(
            "Nothing changed: a hold is in force." if hold else "Nothing changed: no hold.", messages.INFO
        )

    gone = Refusal(TaskNotFound, lambda exc: "This task no longer exists.", to=reverse("console:queue"))
    back = reverse("console:task", kwargs={"task_id": task.id})
    return form_post(request, LegalHoldForm(request.POST), act, back=back, refusals=(gone,))
