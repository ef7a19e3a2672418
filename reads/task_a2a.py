"""A task as A2A sees it, for the task page: who started it over A2A, and where its status changes go.

``read_task_a2a`` is ONE query whatever the task's history: the task row left-joined to its push configs
(at most ``CONFIGS_SHOWN``, newest first), each with its newest delivery and its count of given-up ones as
subqueries (the ``push_delivery_config`` index), and the ``A2AMessage`` that started the task (client,
token name, user agent, context id) as subqueries too. A task nobody reached over A2A reads one row of
nulls: ``TaskA2A.shown`` is False and the page shows nothing.

A URL may carry a path or query the caller considers private: the page shows its scheme, host and
port only (``target``), never the token or credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.db.models import Count, OuterRef, Subquery

from interop.models import A2AMessage, PushDelivery
from tasks.models import Task

CONFIGS_SHOWN = 10  # interop.push.MAX_CONFIGS_PER_TASK live ones, and a few deleted


@dataclass(frozen=True)
class PushTarget:
    """One push config and how its deliveries went (its newest delivery's facts)."""

    config_id: str
    target: str  # scheme://host[:port] of its URL
    live: bool
    version: int | None  # the task version of its newest delivery; None before the first
    status: str  # pending, delivered, failed ("" before the first)
    attempts: int
    last_status: int | None  # the receiver's last HTTP status
    last_error: str
    next_attempt_at: datetime | None  # while pending
    failed: int  # status changes given up


@dataclass(frozen=True)
class TaskA2A:
    caller: str  # who started the task over A2A ("" when it was not)
    token_name: str
    user_agent: str
    context_id: str
    pushes: list[PushTarget]

    @property
    def shown(self) -> bool:
        return bool(self.context_id or self.pushes)


def _target(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"


def read_task_a2a(task: Task) -> TaskA2A:
    started = A2AMessage.objects.filter(task_id=OuterRef("pk"), kind=A2AMessage.Kind.START).order_by("id")
    newest = PushDelivery.objects.filter(config_id=OuterRef("push_configs__id")).order_by("-state_version")
    failed = (
        PushDelivery.objects.filter(config_id=OuterRef("push_configs__id"), status=PushDelivery.Status.FAILED)
        .order_by()
        .values("config_id")
        .annotate(n=Count("pk"))
        .values("n")
    )

    def first(rows: Any, column: str) -> Subquery:
        return Subquery(rows.values(column)[:1])

    rows = list(
        Task.objects.filter(pk=task.pk)
        .annotate(
            a2a_caller=first(started, "caller__username"),
            a2a_token=first(started, "token__name"),
            a2a_agent=first(started, "user_agent"),
            a2a_context=first(started, "context_id"),
            push_version=first(newest, "state_version"),
            push_status=first(newest, "status"),
            push_attempts=first(newest, "attempts"),
            push_last_status=first(newest, "last_status"),
            push_error=first(newest, "last_error"),
            push_next=first(newest, "next_attempt_at"),
            push_failed=Subquery(failed),
        )
        .values(
            "a2a_caller",
            "a2a_token",
            "a2a_agent",
            "a2a_context",
            "push_configs__config_id",
            "push_configs__url",
            "push_configs__deleted_at",
            "push_version",
            "push_status",
            "push_attempts",
            "push_last_status",
            "push_error",
            "push_next",
            "push_failed",
        )
        .order_by("-push_configs__created_at")[:CONFIGS_SHOWN]
    )
    head: dict[str, Any] = dict(rows[0]) if rows else {}
    pushes = [
        PushTarget(
            config_id=row["push_configs__config_id"],
            target=_target(row["push_configs__url"]),
            live=row["push_configs__deleted_at"] is None,
            version=row["push_version"],
            status=row["push_status"] or "",
            attempts=row["push_attempts"] or 0,
            last_status=row["push_last_status"],
            last_error=row["push_error"] or "",
            next_attempt_at=row["push_next"] if row["push_status"] == PushDelivery.Status.PENDING else None,
            failed=row["push_failed"] or 0,
        )
        for row in rows
        if row["push_configs__config_id"] is not None
    ]
    return TaskA2A(
        caller=head.get("a2a_caller") or "",
        token_name=head.get("a2a_token") or "",
        user_agent=head.get("a2a_agent") or "",
        context_id=head.get("a2a_context") or "",
        pushes=pushes,
    )
