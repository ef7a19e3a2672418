"""The task-types page (``/console/task-types/``): what callers can start, and what each start leads to.

Each registered type's contract (``reads.task_types``), the same one ``GET /api/task-types/`` answers
and the A2A agent card is built from: its input fields with the sensitive ones marked, its steps,
which effects need an approver and above which amounts, and its ``version``. Task types are the
deployment's, so anyone holding a role in some tenant sees every one (``task_types.visible_to``);
someone with no role sees none. Two queries of its own at most: the caller's roles (cached on the
user) and the policy versions in force.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from reads import task_types


@require_safe
@login_required
def task_type_list(request: HttpRequest) -> HttpResponse:
    shown = task_types.contracts() if task_types.visible_to(request.user) else []
    return render(request, "console/task_types.html", {"types": shown})
