"""Errors the transition primitive raises. Each maps to a precise API answer."""

from __future__ import annotations


class TransitionError(Exception):
    """Base: the task was not changed. ``state``/``state_version`` are current."""

    code = "transition_error"

    def __init__(self, message: str, *, state: str | None = None, state_version: int | None = None):
        super().__init__(message)
        self.state = state
        self.state_version = state_version


class StaleVersion(TransitionError):
    """The task moved on since ``expected_version`` was read: reload, do not retry blindly."""

    code = "stale_version"


class LeaseLost(StaleVersion):
    """The writer's lease lapsed or was taken over: its work is discarded, like a stale version."""

    code = "lease_lost"


class StaleEpoch(StaleVersion):
    """The task failed over to another region (``manage.py failover``) since the writer read it or
    claimed its lease: the writer's region no longer owns it, and nothing it decided may commit."""

    code = "stale_epoch"


class TransitionNotAllowed(TransitionError):
    """The table has no such edge for this actor from the current state."""

    code = "transition_not_allowed"


class TaskNotFound(TransitionError):
    code = "not_found"
