"""Our tasks on the A2A v1.0 wire: a task as an ``a2a_pb2.Task``, one transition as a
``TaskStatusUpdateEvent``.

Plain functions from our rows to the SDK's protobuf messages (the surface turns them into ProtoJSON with
``google.protobuf.json_format``). The state each of ours reads as is ``interop.states``' table; the
status of a task is built from the transition event that entered its current version, so a status read
now and the status pushed or streamed when that transition happened are the same message.

What every status carries in ``metadata`` (our words, which A2A has none for):

- ``state``: our exact state (``waiting_approval``, ``outcome_unknown``, …);
- ``state_version``: the task's version after the transition (a stream's event id, ``Last-Event-ID``);
- ``reason_code``: the transition's reason code (``retries_exhausted``, ``deadline``, ``cancel:task``, …);
- ``needs_person``: an operator or approver must act before the task moves on;
- ``task_type``: the task's type.

A task waiting for input carries its question as ``status.message`` (the agent's text part): the reason
of the event that entered ``waiting_input`` is the ``RequestInput`` step's question.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from a2a.types import a2a_pb2
from google.protobuf import struct_pb2, timestamp_pb2

from audit.models import TransitionEvent
from interop.models import A2AMessage
from interop.states import reading
from tasks.models import Task
from tasks.states import State

OUTCOME_ARTIFACT = "outcome"  # the one artifact of a completed task: its outcome (sensitive facts masked)


def context_of(task: Task) -> str:
    """The A2A context id of ``task``: the one the message that started it gave (or we gave it), else
    the task's own id (a task started through the REST API or the console)."""
    found = (
        A2AMessage.objects.filter(task=task, kind=A2AMessage.Kind.START)
        .values_list("context_id", flat=True)
        .first()
    )
    return found or str(task.id)


def _timestamp(when: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(when)
    return stamp


def _struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(dict(values))
    return out


def _value(value: Any) -> struct_pb2.Value:
    out = struct_pb2.Value()
    if value is None:
        out.null_value = struct_pb2.NULL_VALUE
    elif isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int | float):
        out.number_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, Mapping):
        out.struct_value.update(dict(value))
    elif isinstance(value, list | tuple):
        out.list_value.extend(list(value))
    else:
        out.string_value = str(value)
    return out


def status_metadata(task: Task, state: str, state_version: int, reason_code: str) -> dict[str, Any]:
    return {
        "state": state,
        "state_version": state_version,
        "reason_code": reason_code,
        "needs_person": reading(state).needs_person,
        "task_type": task.task_type,
    }


def _status(task: Task, event: TransitionEvent, context_id: str) -> a2a_pb2.TaskStatus:
    status = a2a_pb2.TaskStatus(state=reading(event.to_state).a2a, timestamp=_timestamp(event.created_at))  # type: ignore[arg-type]
    if event.to_state == State.WAITING_INPUT:
        status.message.CopyFrom(
            a2a_pb2.Message(
                message_id=f"{task.id}:v{event.state_version}",
                context_id=context_id,
                task_id=str(task.id),
                role=a2a_pb2.Role.ROLE_AGENT,
                parts=[a2a_pb2.Part(text=event.reason or "(question unknown)")],
            )
        )
    return status


def status_update(
    task: Task, event: TransitionEvent, *, context_id: str = ""
) -> a2a_pb2.TaskStatusUpdateEvent:
    """The status change ``event`` (one row of ``task``'s transition log) as A2A tells it: what streams
    send and push notifications deliver. ``context_id`` defaults to ``context_of(task)`` (one query)."""
    context = context_id or context_of(task)
    return a2a_pb2.TaskStatusUpdateEvent(
        task_id=str(task.id),
        context_id=context,
        status=_status(task, event, context),
        metadata=_struct(status_metadata(task, event.to_state, event.state_version, event.reason_code)),
    )


def _history(task: Task, events: Iterable[TransitionEvent], context_id: str) -> list[a2a_pb2.Message]:
    """Each transition as an agent message: ``<from> -> <to>: <reason>``, our names in its metadata."""
    return [
        a2a_pb2.Message(
            message_id=f"{task.id}:v{event.state_version}",
            context_id=context_id,
            task_id=str(task.id),
            role=a2a_pb2.Role.ROLE_AGENT,
            parts=[a2a_pb2.Part(text=f"{event.from_state or 'start'} -> {event.to_state}: {event.reason}")],
            metadata=_struct(
                {
                    "state": event.to_state,
                    "state_version": event.state_version,
                    "trigger": event.trigger,
                    "reason_code": event.reason_code,
                }
            ),
        )
        for event in events
    ]


def current_event(task: Task) -> TransitionEvent:
    """The transition that entered ``task``'s current version (every version has exactly one)."""
    return TransitionEvent.objects.get(task=task, state_version=task.state_version)


def history_events(task: Task, length: int) -> list[TransitionEvent]:
    """The task's last ``length`` transitions, oldest first."""
    newest = TransitionEvent.objects.filter(task=task).order_by("-state_version")[:length]
    return list(reversed(newest))


def to_task(
    task: Task,
    *,
    context_id: str = "",
    outcome: Any = None,
    history_length: int = 0,
    event: TransitionEvent | None = None,
) -> a2a_pb2.Task:
    """``task`` as an A2A ``Task``: its status (from ``event``, by default the transition that entered
    its current version), our exact state in ``metadata``, the completed task's ``outcome`` (give it
    masked, as the caller may see it) as the ``outcome`` artifact, and its last ``history_length``
    transitions as ``history``."""
    context = context_id or context_of(task)
    entered = event if event is not None else current_event(task)
    out = a2a_pb2.Task(
        id=str(task.id),
        context_id=context,
        status=_status(task, entered, context),
        metadata=_struct(status_metadata(task, task.state, task.state_version, entered.reason_code)),
    )
    if task.state == State.COMPLETED:
        out.artifacts.append(
            a2a_pb2.Artifact(
                artifact_id=OUTCOME_ARTIFACT,
                name=OUTCOME_ARTIFACT,
                description=f"The outcome of the {task.task_type} task",
                parts=[a2a_pb2.Part(data=_value(outcome if outcome is not None else {}))],
            )
        )
    if history_length > 0:
        out.history.extend(_history(task, history_events(task, history_length), context))
    return out
