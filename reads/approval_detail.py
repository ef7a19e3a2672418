"""One approval request: what its console page and ``GET /api/approvals/{id}/`` both show, read once.

The request row comes scoped by ``approvals.selectors.get_visible_request`` (with its task, tenant
and decision). Besides it: whether it can still be decided, and its separation of duties (the
earlier decisions on the same action across the task's reruns, and who may not decide it and why):
the lineage (one query per rerun generation), the decisions, the people who caused it, and for a
viewing user the rule that may stop them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from approvals import selectors
from approvals.models import ApprovalRequest


@dataclass(frozen=True)
class ApprovalDetail:
    """One request as both surfaces show it."""

    request: ApprovalRequest
    live: bool  # pending, unexpired, and its task still waits for exactly it
    separation: selectors.Separation


def read_approval_detail(request: ApprovalRequest, *, viewer: Any = None) -> ApprovalDetail:
    """The detail of ``request``; with ``viewer``, its separation says why they may not decide it."""
    return ApprovalDetail(
        request=request,
        live=selectors.is_live(request),
        separation=selectors.separation(request, viewer),
    )
