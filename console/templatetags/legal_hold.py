"""``{% legal_hold_panel %}``: the task page's legal hold and archive status (``console.legal_hold``)."""

from __future__ import annotations

from typing import Any

from django import template

from console.legal_hold import LegalHoldForm, may_hold
from tasks.models import Archive

register = template.Library()

HOLDS_SHOWN = 10


@register.inclusion_tag("console/task/legal_hold.html", takes_context=True)
def legal_hold_panel(context: template.Context) -> dict[str, Any]:
    """Two small queries: the newest holds (the one in force is among them) and the archive record."""
    task, request = context["task"], context["request"]
    holds = list(task.legal_holds.order_by("-placed_at", "-id")[:HOLDS_SHOWN])
    in_force = next((hold for hold in holds if hold.lifted_at is None), None)
    can_hold = may_hold(request.user, task)
    return {
        "task": task,
        "holds": holds,
        "in_force": in_force,
        "archive": Archive.objects.filter(task=task).first(),
        "form": LegalHoldForm(initial={"hold": "lift" if in_force else "place"}) if can_hold else None,
        "csrf_token": context.get("csrf_token"),
    }
