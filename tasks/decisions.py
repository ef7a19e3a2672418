"""What a worker decided to do next: a transition it will try to commit."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tasks import registry
from tasks.checkpoints import Progress
from tasks.leases import Held
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, Advanced, advance, advance_read


@dataclass(frozen=True)
class Decision:
    to_state: State
    trigger: Trigger
    progress: Progress | None
    reason: str = ""
    reason_code: str = ""
    changes: dict[str, Any] = field(default_factory=dict)
    actions: tuple[ActionIntent, ...] = ()  # intents committed with the transition (the outbox)
    records: tuple[Any, ...] = ()  # other rows committed with it (an approval request)
    also: tuple[Callable[[], None], ...] = ()  # further writes inside its transaction


def commit(task: Task, decision: Decision, *, actor: Actor, lease: Held | None = None) -> Task:
    """Apply ``decision`` to ``task`` at the version it was decided from (see ``advance``)."""
    return advance(task.id, task.state_version, decision.to_state, **_options(decision, actor, lease))


def commit_read(
    task: Task, decision: Decision, *, actor: Actor, lease: Held, release: bool = False
) -> Advanced:
    """``commit`` from the row the worker read, without reading it again (see ``advance_read``;
    ``release``: give the lease up in the same statement)."""
    return advance_read(task, decision.to_state, release=release, **_options(decision, actor, lease))


def _options(decision: Decision, actor: Actor, lease: Held | None) -> dict[str, Any]:
    return dict(
        actor=actor,
        trigger=decision.trigger,
        reason=decision.reason,
        reason_code=decision.reason_code,
        progress=decision.progress,
        actions=decision.actions,
        records=decision.records,
        also=decision.also,
        lease=lease,
        **decision.changes,
    )


def quarantine(progress: Progress | None, code: str, reason: str) -> Decision:
    return Decision(State.QUARANTINED, Trigger.QUARANTINE, progress, reason=reason, reason_code=code)


def retry_later(
    task: Task,
    kind: registry.TaskType,
    progress: Progress,
    now: datetime,
    *,
    code: str,
    reason: str,
    trigger: Trigger = Trigger.ATTEMPT_FAILED,
) -> Decision:
    """A transient failure (or, by ``step_timed_out``, a timeout): wait with backoff while attempts
    remain, then fail."""
    attempt = task.attempt + 1
    if attempt >= kind.max_attempts:
        return Decision(
            State.FAILED,
            Trigger.FAIL,
            progress,
            reason=reason,
            reason_code="retries_exhausted",
            changes={"attempt": attempt, "outcome": {"reason": "retries_exhausted", "last_error": code}},
        )
    return Decision(
        State.WAITING_RETRY,
        trigger,
        progress,
        reason=reason,
        reason_code=code,
        changes={"attempt": attempt, "wait_deadline": now + kind.backoff_for(attempt)},
    )
