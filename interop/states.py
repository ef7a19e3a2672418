"""The one table of how our task states read over A2A v1.0.

A2A has no "unknown" state and no word for "an operator must look at this": everything still in our
hands reads ``WORKING``, and the metadata of every status carries our exact state, its reason code and
whether a person must act (``needs_person``). An effect in doubt (``outcome_unknown``) is never reported
as completed or failed. A caller never decides an approval: ``waiting_approval`` reads ``WORKING`` for
everyone, and the request goes to our approvers (console and API) as for any other task.
"""

from __future__ import annotations

from dataclasses import dataclass

from a2a.types import a2a_pb2

from tasks.states import State

TaskState = a2a_pb2.TaskState
WORKING = TaskState.TASK_STATE_WORKING


@dataclass(frozen=True)
class Reading:
    """How one of our states reads over A2A."""

    a2a: int  # an a2a_pb2.TaskState value
    needs_person: bool  # an operator or approver must act before the task moves on
    note: str  # what the caller is told, in a few words (the docs' table shows it)


READINGS: dict[str, Reading] = {
    State.READY: Reading(WORKING, False, "queued or running in a worker"),
    State.RESUME_VALIDATION: Reading(WORKING, False, "checking its checkpoint before it goes on"),
    State.WAITING_RETRY: Reading(WORKING, False, "a step failed and is retried after a backoff"),
    State.WAITING_CHILDREN: Reading(WORKING, False, "waiting for the child tasks it started"),
    State.WAITING_EXTERNAL: Reading(WORKING, False, "waiting for an outside system's callback"),
    State.WAITING_APPROVAL: Reading(WORKING, True, "waiting for one of our approvers"),
    State.CANCEL_REQUESTED: Reading(WORKING, False, "stopping at its next safe point"),
    State.OUTCOME_UNKNOWN: Reading(WORKING, False, "an effect's outcome is being reconciled"),
    State.QUARANTINED: Reading(WORKING, True, "held for an operator"),
    State.WAITING_INPUT: Reading(TaskState.TASK_STATE_INPUT_REQUIRED, False, "asks the caller a question"),
    State.COMPLETED: Reading(TaskState.TASK_STATE_COMPLETED, False, "done"),
    State.FAILED: Reading(TaskState.TASK_STATE_FAILED, False, "ended without completing"),
    State.CANCELED: Reading(TaskState.TASK_STATE_CANCELED, False, "canceled"),
    State.EXPIRED: Reading(TaskState.TASK_STATE_FAILED, False, "its deadline passed (reason in metadata)"),
}
# Admission refused the message before any task existed (a bad input, a type the tenant lacks).
REJECTED = TaskState.TASK_STATE_REJECTED

assert set(READINGS) == set(State.values), "every state has exactly one A2A reading"


def reading(state: str) -> Reading:
    return READINGS[state]


def a2a_state(state: str) -> int:
    return READINGS[state].a2a


def a2a_state_name(state: str) -> str:
    """The ProtoJSON name of the state our ``state`` reads as, e.g. ``TASK_STATE_INPUT_REQUIRED``."""
    return str(TaskState.Name(READINGS[state].a2a))
