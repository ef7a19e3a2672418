"""Read-side queries: tenant first, then the object permission (django-guardian).

Who may decide a request (``decidable``) is one SQL condition, so the inbox, its
count, a request page and ``GET /api/approvals/?status=pending`` each cost one
query whose work depends on the page read, not on how many requests are pending:
the grant is looked up per request through the direct object-permission tables
(``approvals.models.ApprovalRequestGroupPermission``: uuid foreign key, indexed),
never by guardian's generic, text-typed ``object_pk``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import django_filters
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import BooleanField, Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.http import Http404
from django.utils import timezone

from approvals import authority
from approvals.models import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalRequestGroupPermission,
    ApprovalRequestUserPermission,
    ApprovalStatus,
    Decision,
)
from audit import sealing
from config.external import path_segment, public_url
from tasks.states import State
from tenancy.selectors import roles_by_tenant, tenant_ids_for

DECIDE = "approvals.decide_approvalrequest"


class ApprovalFilter(django_filters.FilterSet):
    status = django_filters.ChoiceFilter(choices=ApprovalStatus.choices)
    task_type = django_filters.CharFilter(field_name="task__task_type")
    tenant = django_filters.CharFilter(field_name="tenant__slug")

    class Meta:
        model = ApprovalRequest
        fields = ["status", "task_type", "tenant"]


def visible_requests(user: Any) -> QuerySet[ApprovalRequest]:
    return ApprovalRequest.objects.filter(tenant_id__in=tenant_ids_for(user))


def get_visible_request(user: Any, request_id: UUID | str) -> ApprovalRequest:
    found = (
        visible_requests(user).select_related("task", "tenant", "decision__decided_by").filter(pk=request_id)
    )
    request = found.first()
    if request is None:
        raise Http404("No such approval request")
    return request


def is_live(request: ApprovalRequest) -> bool:
    """Pending, unexpired, and its task still waits for exactly this request."""
    return (
        request.status == ApprovalStatus.PENDING
        and timezone.now() < request.expires_at
        and request.task.state == State.WAITING_APPROVAL
        and request.task.state_version == request.waiting_version
    )


def evidence_url(ref: dict[str, Any]) -> str:
    """Where an approver can open the record an evidence reference points to ("" when no safe link exists).

    Built from the system's public base (``CONNECTOR_<NAME>_PUBLIC_URL``, else its URL; neither
    holds a credential) and the record id as one quoted path segment. An id of ``.`` or ``..``
    gets no link: browsers treat even its encoded form (``%2E%2E``) as a dot segment and would
    open a page outside ``/records/``.
    """
    record_id = str(ref.get("record_id", ""))
    if record_id in (".", ".."):
        return ""
    return f"{public_url(str(ref.get('system', '')))}/records/{path_segment(record_id)}"


def decidable(user: Any) -> Q:
    """The condition "``user`` may decide this request", as ``approval_decide`` checks it one by one.

    The request's ``approver_role`` held in its tenant, the ``decide`` object
    permission (granted to the user or to one of their groups; superusers hold
    every permission, as ``user.has_perm`` says), and not a request that names
    them as one who caused it (``approvals.authority.not_barred``).
    """
    by_role = Q(pk__in=[])  # no roles: nothing (and no query at all)
    for tenant_id, held in roles_by_tenant(user).items():
        by_role |= Q(tenant_id=tenant_id, approver_role__in=sorted(held))
    if not user.is_authenticated:
        return by_role
    condition = by_role & authority.not_barred(user)
    if user.is_superuser:
        return condition
    app_label, codename = DECIDE.split(".")
    permission = Permission.objects.filter(content_type__app_label=app_label, codename=codename).values("pk")
    groups = get_user_model().groups.through.objects.filter(user_id=user.pk).values("group_id")
    via_group = ApprovalRequestGroupPermission.objects.filter(
        content_object=OuterRef("pk"), permission_id=Subquery(permission[:1]), group_id__in=groups
    )
    if not _holds_own_grants(user):
        # The usual case (grants go to role groups): a plain AND, which PostgreSQL turns
        # into a semi-join probing the grant index once per row it reads. Inside an OR it
        # would build a hash of every grant instead, which grows with the backlog.
        return condition & Q(Exists(via_group))
    via_user = ApprovalRequestUserPermission.objects.filter(
        content_object=OuterRef("pk"), permission_id=Subquery(permission[:1]), user_id=user.pk
    )
    return condition & (Q(Exists(via_group)) | Q(Exists(via_user)))


def _holds_own_grants(user: Any) -> bool:
    """Was ``user`` granted any request in person (not through a group)? Asked once per request cycle."""
    cached = getattr(user, "_holds_approval_grants", None)
    if cached is None:
        cached = ApprovalRequestUserPermission.objects.filter(user_id=user.pk).exists()
        user._holds_approval_grants = cached
    return cached


# The task still waits for exactly this request, checked row by row. Written as an EXISTS that
# PostgreSQL keeps as a per-row filter (``OFFSET 0`` stops it turning into a join): as a join
# it estimates ``state = 'waiting_approval' AND state_version = waiting_version`` as if the
# two were independent (a few dozen live requests out of thousands), so it read and sorted
# every pending request instead of walking ``approval_inbox_expiry`` / ``approval_inbox`` in
# the page's order and stopping after one page (53 ms -> 1 ms at 10,000 pending, 100k tasks).
# ``LIMIT 1 OFFSET 0`` is valid on SQLite too.
_TASK_WAITS_FOR_IT = (
    'EXISTS (SELECT 1 FROM "tasks_task" W WHERE W."id" = "approvals_approvalrequest"."task_id"'
    ' AND W."state" = %s AND W."state_version" = "approvals_approvalrequest"."waiting_version"'
    " LIMIT 1 OFFSET 0)"
)


def live_requests() -> QuerySet[ApprovalRequest]:
    """Pending, unexpired requests whose task still waits for exactly them (``is_live`` in SQL)."""
    return ApprovalRequest.objects.filter(
        RawSQL(_TASK_WAITS_FOR_IT, (State.WAITING_APPROVAL.value,), BooleanField()),
        status=ApprovalStatus.PENDING,
        expires_at__gt=timezone.now(),
    )


def inbox(user: Any) -> QuerySet[ApprovalRequest]:
    """Requests ``user`` may decide now, oldest first."""
    return (
        live_requests()
        .filter(decidable(user))
        .select_related("task", "tenant", "decision__decided_by")
        .order_by("created_at")
    )


def may_decide_now(user: Any, request: ApprovalRequest) -> bool:
    return inbox(user).filter(pk=request.pk).exists()


# The console inbox: what it lists, in which order, and how far it counts.
DECIDED_BY_ME = "decided_by_me"
STATUSES = {
    ApprovalStatus.PENDING.value: "Waiting for me",
    DECIDED_BY_ME: "Decided by me",
    ApprovalStatus.APPROVED.value: "Approved",
    ApprovalStatus.REJECTED.value: "Rejected",
    ApprovalStatus.EXPIRED.value: "Expired",
    ApprovalStatus.INVALIDATED.value: "Invalidated",
}
# sort name -> (label, column, descending)
SORTS = {
    "time_left": ("Least time left", "expires_at", False),
    "oldest": ("Oldest first", "created_at", False),
    "newest": ("Newest first", "created_at", True),
}
COUNT_CAP = 500  # the inbox counts up to here ("500+"): counting further would grow with the backlog
BADGE_CAP = 99


@dataclass(frozen=True)
class InboxPage:
    rows: list[ApprovalRequest]
    total: int  # up to ``COUNT_CAP``
    more_than_total: bool  # there are more than ``total``
    next_cursor: str  # "" on the last page


def _listed(user: Any, status: str) -> QuerySet[ApprovalRequest]:
    if status == ApprovalStatus.PENDING:
        return live_requests().filter(decidable(user))
    if status == DECIDED_BY_ME:
        return visible_requests(user).filter(decision__decided_by_id=user.pk)
    return visible_requests(user).filter(status=status)


def _cursor(row: ApprovalRequest, column: str) -> str:
    return f"{getattr(row, column).isoformat()}~{row.pk}"


def _after(cursor: str) -> tuple[datetime, UUID] | None:
    """The position a cursor names, or ``None`` (first page) for a missing or mangled one."""
    try:
        when, pk = cursor.split("~")
        at = datetime.fromisoformat(when)
        return (at, UUID(pk)) if at.tzinfo is not None else None
    except ValueError:
        return None


def inbox_page(
    user: Any,
    *,
    status: str = ApprovalStatus.PENDING,
    sort: str = "time_left",
    task_type: str = "",
    tenant_id: int | None = None,
    cursor: str = "",
    size: int = 50,
) -> InboxPage:
    """One page of the console's approvals list, keyset-paged on (sort column, id).

    Three queries however long the list: the page, its (capped) count, and
    nothing else -- rows come with their task, tenant and decision.
    """
    _label, column, descending = SORTS.get(sort, SORTS["time_left"])
    listed = _listed(user, status if status in STATUSES else ApprovalStatus.PENDING)
    if task_type:
        listed = listed.filter(task__task_type=task_type)
    if tenant_id is not None:
        listed = listed.filter(tenant_id=tenant_id)
    total = listed.order_by()[: COUNT_CAP + 1].count()
    page = listed
    position = _after(cursor)
    if position is not None:
        table = ApprovalRequest._meta.db_table
        compare = "<" if descending else ">"
        page = page.filter(
            RawSQL(f'("{table}"."{column}", "{table}"."id") {compare} (%s, %s)', position, BooleanField())
        )
    order = [f"-{column}", "-id"] if descending else [column, "id"]
    rows = list(page.select_related("task", "tenant", "decision__decided_by").order_by(*order)[: size + 1])
    return InboxPage(
        rows=rows[:size],
        total=min(total, COUNT_CAP),
        more_than_total=total > COUNT_CAP,
        next_cursor=_cursor(rows[size - 1], column) if len(rows) > size else "",
    )


def pending_count(user: Any, cap: int = BADGE_CAP) -> int:
    """How many requests ``user`` may decide now, counted up to ``cap`` + 1 (one COUNT)."""
    return live_requests().filter(decidable(user)).order_by()[: cap + 1].count()


def earlier_request(request: ApprovalRequest) -> ApprovalRequest | None:
    """The request made before ``request`` for the same task and action step (a repeat's original).

    Ordered by the task's version when each was asked, a sequence: two requests written in the same
    instant (a seeded demo, a coarse clock) share ``created_at``, and the repeat then found nothing."""
    return (
        ApprovalRequest.objects.filter(
            task_id=request.task_id,
            action_step=request.action_step,
            waiting_version__lt=request.waiting_version,
        )
        .select_related("decision__decided_by")
        .order_by("-waiting_version")
        .first()
    )


def next_to_decide(user: Any, *, besides: ApprovalRequest) -> ApprovalRequest | None:
    """The pending request ``user`` may decide that their inbox lists first (least time left), other
    than ``besides``: where an approver goes after a decision."""
    return live_requests().filter(decidable(user)).exclude(pk=besides.pk).order_by("expires_at", "id").first()


@dataclass(frozen=True)
class EarlierDecision:
    """A decision on an earlier request for the same action, on this task or one it reruns."""

    request_id: UUID
    task_id: UUID
    decision: str  # "approve" / "reject"
    by: str  # the decider's username
    at: datetime
    comment: str


@dataclass(frozen=True)
class MayNotDecide:
    actor: str  # actor id, ``user:<username>``
    why: str  # "reran this task, escalated it"


@dataclass(frozen=True)
class Separation:
    """Separation of duties on one request, as its page and ``GET /api/approvals/{id}/`` show it:
    the earlier decisions it overrides or repeats, and who may not decide it and why."""

    earlier: list[EarlierDecision]
    may_not_decide: list[MayNotDecide]
    refusal: str  # why the viewing user may not decide it ("" when that rule does not stop them)

    @property
    def overrides_rejection(self) -> bool:
        """Approving it would override an earlier rejection of the same action."""
        return any(made.decision == Decision.REJECT for made in self.earlier)


def separation(request: ApprovalRequest, user: Any = None) -> Separation:
    """The earlier decisions for ``request``'s action on its lineage (oldest first), and whom it bars.

    A fixed number of queries: the lineage (one per generation) and the decisions.
    """
    tasks = [task.pk for task in authority.lineage(request.task)]
    decisions = (
        ApprovalDecision.objects.filter(
            request__task_id__in=tasks,
            request__action_step=request.action_step,
            request__created_at__lt=request.created_at,
        )
        .select_related("request", "decided_by")
        .order_by("decided_at", "id")
    )
    refused = authority.refusal(user, request) if user is not None and user.is_authenticated else None
    return Separation(
        earlier=[
            EarlierDecision(
                request_id=made.request_id,
                task_id=made.request.task_id,
                decision=made.decision,
                by=made.decided_by.get_username(),
                at=made.decided_at,
                comment=made.comment,
            )
            for made in decisions
        ],
        may_not_decide=[
            MayNotDecide(actor, authority.why(causes)) for actor, causes in authority.barred(request).items()
        ],
        refusal=refused[1] if refused else "",
    )


@dataclass(frozen=True)
class Change:
    what: str  # "effect.amount", "fact order_total", "evidence orders/A-1"
    before: Any
    after: Any


def _flat(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, inner in value.items():
            flat.update(_flat(f"{prefix}.{key}" if prefix else str(key), inner))
        return flat
    return {prefix: value}


def _evidence_versions(refs: list[dict[str, Any]]) -> dict[str, Any]:
    return {f"{ref.get('system')}/{ref.get('record_id')}": ref.get("record_version") for ref in refs}


def _changes(before: dict[str, Any], after: dict[str, Any], label: str) -> list[Change]:
    return [
        Change(f"{label}{key}", before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def _sealed_changes(
    earlier: ApprovalRequest, request: ApprovalRequest, column: str, label: str
) -> list[Change]:
    """``_changes`` of a column holding sealed values: compared opened (each sealing's token differs),
    shown masked. Under a retired key they are compared as shown."""
    shown = _flat("", earlier.shown(column)), _flat("", request.shown(column))
    try:
        before, after = _flat("", earlier.opened(column)), _flat("", request.opened(column))
    except sealing.Unopenable:
        before, after = shown
    return [
        Change(f"{label}{key}", shown[0].get(key), shown[1].get(key))
        for key in sorted(before.keys() | after.keys())
        if before.get(key) != after.get(key)
    ]


def repeat_changes(earlier: ApprovalRequest, request: ApprovalRequest) -> list[Change]:
    """What a repeat request asks differently: the consequential fields, the facts, the evidence versions."""
    return [
        *_sealed_changes(earlier, request, "consequential", ""),
        *_sealed_changes(earlier, request, "material", "fact "),
        *_changes(_evidence_versions(earlier.evidence), _evidence_versions(request.evidence), "evidence "),
    ]


def evidence_changes(request: ApprovalRequest, current: list[dict[str, Any]]) -> list[Change]:
    """Records whose version the task holds now differs from the one the request was made with.

    ``current`` is the evidence of the task's newest checkpoint (what the task
    last read), not a fresh read of the systems; a record the task no longer
    holds is not a change.
    """
    now = _evidence_versions(current)
    return [
        Change(f"evidence {key}", version, now[key])
        for key, version in _evidence_versions(request.evidence).items()
        if key in now and now[key] != version
    ]
