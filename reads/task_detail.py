"""One task's detail: what the task page and ``GET /api/tasks/{id}/`` show, read once.

``read_task_detail`` returns a ``TaskDetail``; the API serializes it and the console renders it, so
the two cannot drift. Its cost is fixed whatever the task's history: every list is one indexed query
capped at the size the caller passes (``Sections``), and nothing is read per row. The API lists every
child, cancel request and rerun (``None``) and no approvals or actions (its history endpoints page
those); the console caps each list at what its page shows.

Budget (at most): the lease with the model usage totals (one query), its takeovers, the ledger, the
pending approvals (only while the task waits for one), children, cancel requests, reruns, the parent
and the task it reruns (one query for both, only when it has either), approvals, actions, the
compensated action, the compensation offers (``tasks.compensation.offers``, up to four, only for a
canceled task), the user's roles (once per request), and for an agent's task its turns with what
became of their calls (``reads.agent_turns``: at most four). A list sized 0 is not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import LeaseTakeover
from ledger.models import Action
from protection import reveal
from reads.agent_turns import AgentTurns, read_agent_turns
from reads.visibility import allowed_moves
from tasks import compensation
from tasks.models import CancelRequest, Lease, Task
from tasks.states import State

TAKEOVERS_SHOWN = 5  # newest lease takeovers, on both surfaces

Row = TypeVar("Row")


@dataclass(frozen=True)
class Sections:
    """How many rows of each list a surface shows: ``None`` every one, ``0`` none (and no query)."""

    children: int | None
    cancel_requests: int | None
    reruns: int | None
    pending_approvals: int | None
    approvals: int | None
    actions: int | None
    agent_turns: int | None = 0  # an agent run's turns (``reads.agent_turns``); the API reads none yet


@dataclass(frozen=True)
class TaskLink:
    """Another task as a link shows it: a child, a rerun, the parent, the task this one reruns."""

    id: UUID
    task_type: str
    state: str


@dataclass(frozen=True)
class Usage:
    """A task's model usage: the sums of its ``runtime.ModelUsage`` rows (every turn billed, kept or not).

    ``cost`` is None unless every turn was priced (``unpriced`` says how many were not): a partial sum
    would read as the whole bill."""

    turns: int
    input_tokens: int
    output_tokens: int
    cost: Decimal | None
    unpriced: int


@dataclass(frozen=True)
class TaskDetail:
    """Everything both surfaces show about ``task`` besides its own row."""

    task: Task
    lease: Lease | None  # the task's lease row, expired or not
    lease_live: bool  # it had not expired when read
    usage: Usage  # what its model turns used and cost
    takeovers: tuple[LeaseTakeover, ...]  # newest first
    ledger: dict[str, int]  # dispatch state -> how many of its actions stand there
    pending_approvals: tuple[ApprovalRequest, ...]  # the requests it waits for now, oldest first
    approvals: tuple[ApprovalRequest, ...]  # every request raised for it (pending ones too), newest first
    actions: tuple[Action, ...]  # its ledger rows, oldest first
    children: tuple[TaskLink, ...]  # the tasks it started, oldest first
    cancel_requests: tuple[CancelRequest, ...]  # newest first
    reruns: tuple[TaskLink, ...]  # the tasks started to run it again, oldest first
    parent: TaskLink | None
    rerun_of: TaskLink | None
    compensations: tuple[compensation.Offer, ...]  # a canceled task's effects left done it may undo
    compensates: Action | None  # for a compensation run: the action it undoes
    agent_turns: AgentTurns  # an agent run's model turns, their calls and what became of them
    allowed_moves: list[dict[str, str]]  # the edges the reading user could take now
    input: Any  # sensitive fields masked
    outcome: Any  # sensitive facts masked


def read_task_detail(task: Task, *, user: Any, sections: Sections) -> TaskDetail:
    """The detail of ``task`` (already scoped to ``user``) with each list capped by ``sections``."""
    lease, usage = _lease_and_usage(task)
    links = _links(task)
    return TaskDetail(
        task=task,
        lease=lease,
        lease_live=lease is not None and lease.expires_at > timezone.now(),
        usage=usage,
        takeovers=tuple(LeaseTakeover.objects.filter(task=task).order_by("-taken_at")[:TAKEOVERS_SHOWN]),
        ledger=ledger_summary(task),
        pending_approvals=_pending_approvals(task, sections.pending_approvals),
        approvals=_capped(
            ApprovalRequest.objects.filter(task=task).order_by("-created_at"), sections.approvals
        ),
        actions=_capped(Action.objects.filter(task=task).order_by("id"), sections.actions),
        children=_task_links(Task.objects.filter(parent=task), sections.children),
        cancel_requests=_capped(
            CancelRequest.objects.filter(task=task).order_by("-requested_at"), sections.cancel_requests
        ),
        # Compensation runs link to the task the same way; they are listed with its effects instead.
        reruns=_task_links(compensation.reruns(task), sections.reruns),
        parent=links.get(task.parent_id) if task.parent_id else None,
        rerun_of=links.get(task.rerun_of_id) if task.rerun_of_id else None,
        compensations=tuple(compensation.offers(task)),
        compensates=task.compensates,
        agent_turns=read_agent_turns(task, sections.agent_turns),
        allowed_moves=allowed_moves(user, task),
        input=reveal.masked_input(task),
        outcome=reveal.masked_outcome(task),
    )


LEASE_COLUMNS = tuple(Lease._meta.concrete_fields)


def _lease_and_usage(task: Task) -> tuple[Lease | None, Usage]:
    """The task's lease row (if any) and its usage sums, in one query: the task row LEFT JOINed to its
    lease and its usage rows (the ``model_usage_one_per_turn`` index), grouped by the lease's columns."""
    row = (
        Task.objects.filter(pk=task.pk)
        .values(*(f"lease__{field.name}" for field in LEASE_COLUMNS))
        .annotate(
            turns=Count("model_usages"),
            input_tokens=Sum("model_usages__input_tokens"),
            output_tokens=Sum("model_usages__output_tokens"),
            cost=Sum("model_usages__cost"),
            unpriced=Count("model_usages", filter=Q(model_usages__cost__isnull=True)),
        )
        .get()
    )
    lease = None
    if row["lease__task"] is not None:
        values = [row[f"lease__{field.name}"] for field in LEASE_COLUMNS]
        lease = Lease.from_db(Lease.objects.db, [field.attname for field in LEASE_COLUMNS], values)
        lease.task = task
    usage = Usage(
        turns=row["turns"],
        input_tokens=row["input_tokens"] or 0,
        output_tokens=row["output_tokens"] or 0,
        cost=None if row["unpriced"] else row["cost"] or Decimal(0),
        unpriced=row["unpriced"],
    )
    return lease, usage


def ledger_summary(task: Task) -> dict[str, int]:
    """How many of the task's actions stand in each dispatch state (one GROUP BY)."""
    rows = Action.objects.filter(task=task).values("dispatch_state").annotate(n=Count("id"))
    return {row["dispatch_state"]: row["n"] for row in rows}


def _capped(rows: QuerySet[Any, Row], size: int | None) -> tuple[Row, ...]:
    if size == 0:
        return ()
    return tuple(rows if size is None else rows[:size])


def _task_links(tasks: QuerySet[Task], size: int | None) -> tuple[TaskLink, ...]:
    rows = _capped(tasks.order_by("id").values_list("id", "task_type", "state"), size)
    return tuple(TaskLink(*row) for row in rows)


def _links(task: Task) -> dict[UUID, TaskLink]:
    """The parent and the task this one reruns, in one query (none when it has neither)."""
    wanted = [pk for pk in (task.parent_id, task.rerun_of_id) if pk is not None]
    if not wanted:
        return {}
    rows = Task.objects.filter(pk__in=wanted).values_list("id", "task_type", "state")
    return {row[0]: TaskLink(*row) for row in rows}


def _pending_approvals(task: Task, size: int | None) -> tuple[ApprovalRequest, ...]:
    if task.state != State.WAITING_APPROVAL:
        return ()  # a request the task no longer waits for is not pending, whatever its row says yet
    pending = ApprovalRequest.objects.filter(
        task=task, status=ApprovalStatus.PENDING, waiting_version=task.state_version
    )
    return _capped(pending.order_by("created_at"), size)
