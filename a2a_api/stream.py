"""Live status streams of A2A v1.0: ``SendStreamingMessage`` and ``SubscribeToTask`` as server-sent events.

What a stream sends (the JSON-RPC binding: each SSE ``data:`` is one JSON-RPC response object whose
``result`` is a ``StreamResponse``):

1. the task as it is (``{"task": …}``, as ``GetTask`` reads it), with ``id: <state_version>``;
2. then one ``{"statusUpdate": …}`` per transition of the task after that version, in ``state_version``
   order, each with ``id: <its state_version>``; a transition into ``completed`` is preceded by an
   ``{"artifactUpdate": …}`` with the outcome artifact (masked), sent without an ``id`` line in the same
   write, so a resume after that status never repeats it and one before it loses nothing.

It ends after a terminal state, or after ``INPUT_REQUIRED`` while the task still waits for the caller's
answer (an answer sent with ``SendStreamingMessage`` + ``taskId`` opens the next stream), or after
``A2A_STREAM_MAX_SECONDS``: the caller then resubscribes. The events come from the transition log
(``audit.TransitionEvent``), never from process memory: every process serves every task's stream, and a
stream resumed on another process continues where the first one stopped.

**Resuming.** A request with the header ``Last-Event-ID: <state_version>`` (SSE's reconnection header:
the ``id`` of the last event received) sends no snapshot and continues with the transitions after that
version — nothing lost, nothing repeated. With the a2a-sdk client:
``client.subscribe(SubscribeToTaskRequest(id=…), context=ClientCallContext(service_parameters={
"Last-Event-ID": "7"}))``. ``SubscribeToTask`` of an ended task without it answers the final task and
ends (the spec says ``UnsupportedOperationError``; a caller whose stream dropped as its task ended
gets the end instead of an error).

**Resources.** A stream holds no database connection and no transaction between polls: each poll
(every ``A2A_STREAM_POLL_SECONDS``) reads the log in one short transaction and closes its connection.
Under gunicorn's ``gthread`` workers it holds one thread of its process for its whole length; a
process serves at most ``A2A_STREAM_MAX_OPEN`` streams at once (more: HTTP 503 with ``Retry-After``
and a JSON-RPC error), so streams never take all of a process's ``WEB_THREADS``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import select
import socket
import threading
import time
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from a2a.types import a2a_pb2
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.http import Http404, StreamingHttpResponse
from google.protobuf import json_format

from a2a_api import methods
from a2a_api.rpc import Call, Code, RpcError, method
from audit.models import TransitionEvent
from interop import wire
from interop.states import reading
from protection.reveal import masked_outcome
from reads import visibility
from tasks.models import Task
from tasks.states import State
from tenancy.services import token_still_usable

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/event-stream; charset=utf-8"
RESUME_HEADER = "Last-Event-ID"
BATCH = 200  # transitions read per poll at most (a resumed stream far behind catches up in several)
HEARTBEAT_SECONDS = 2.0  # an SSE comment after this long without output: proxies keep the connection,
# and writes to a caller that went away fail within a few beats, ending its stream long before
# A2A_STREAM_MAX_SECONDS (under gunicorn a closed socket is seen at the next poll: ``peer_gone``).

_States = a2a_pb2.TaskState
ENDED = frozenset(
    {
        _States.TASK_STATE_COMPLETED,
        _States.TASK_STATE_FAILED,
        _States.TASK_STATE_CANCELED,
        _States.TASK_STATE_REJECTED,
    }
)
INTERRUPTED = frozenset({_States.TASK_STATE_INPUT_REQUIRED, _States.TASK_STATE_AUTH_REQUIRED})


# --- frames ------------------------------------------------------------------------------------


def _data(request_id: Any, body: dict[str, Any]) -> str:
    # Compact JSON escapes every newline inside strings: one response is one ``data:`` line.
    return json.dumps({"jsonrpc": "2.0", "id": request_id, **body}, separators=(",", ":"))


def result_frame(request_id: Any, result: dict[str, Any], event_id: int | None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {_data(request_id, {'result': result})}\n\n".encode()


def error_frame(request_id: Any, error: RpcError) -> bytes:
    """A refusal once the stream has started: SSE ``event: error`` (the a2a-sdk raises it as the
    JSON-RPC error it carries)."""
    return f"event: error\ndata: {_data(request_id, {'error': error.as_error()})}\n\n".encode()


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def _ends(a2a_state: int, *, still_current: bool) -> bool:
    """Whether a stream ends after a status in ``a2a_state``: terminal always; interrupted (the caller
    must answer) only while it is still the task's current state."""
    return a2a_state in ENDED or (a2a_state in INTERRUPTED and still_current)


# --- the per-process limit ---------------------------------------------------------------------


class _Slots:
    """How many streams this process has open, at most ``A2A_STREAM_MAX_OPEN``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.open = 0

    def take(self) -> bool:
        with self._lock:
            if self.open >= settings.A2A_STREAM_MAX_OPEN:
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.open -= 1


SLOTS = _Slots()


# --- one stream --------------------------------------------------------------------------------


def peer_gone(peer: socket.socket | None) -> bool:
    """Whether the caller closed its connection: readable with nothing to read (an orderly close), or
    broken. ``peer`` is gunicorn's client socket (``gunicorn.socket``); other servers find out only
    when a write fails (the heartbeat)."""
    if peer is None:
        return False
    try:
        readable, _, _ = select.select([peer], [], [], 0)
        return bool(readable) and peer.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset, or a socket that cannot peek (TLS): judge by writes then
        return False


def release_connection() -> None:
    """Close this thread's database connection between polls, unless a caller's transaction (a test's)
    holds it: a sleeping stream must not hold a connection or a transaction."""
    if not connection.in_atomic_block:
        connection.close()


@dataclass
class TaskStream:
    """The frames of one stream: ``opening`` (the snapshot, or nothing on a resume), then what each poll
    of the transition log finds after ``after``. ``steps()`` is the one loop; ``__iter__`` (WSGI) and
    ``__aiter__`` (ASGI) only sleep differently."""

    request_id: Any
    task: Task
    user: Any
    token_id: int | None
    context_id: str
    after: int
    opening: bytes
    peer: socket.socket | None = None
    done: bool = False
    started: float = field(default_factory=time.monotonic)
    _slot_held: bool = True

    def close(self) -> None:
        """Give this stream's slot back (once): the server closes the response however it ended."""
        if self._slot_held:
            self._slot_held = False
            SLOTS.give_back()

    # -- reading the log (one short transaction per poll) --

    def _still_allowed(self) -> Task | None:
        """The task, re-read as the caller may see it now; None when its token or its access ended."""
        if self.token_id is not None and not token_still_usable(self.token_id):
            return None
        try:
            return visibility.get_visible_task(self.user, self.task.id)
        except Http404:
            return None

    def _frames_of(self, task: Task, event: TransitionEvent) -> bytes:
        out = b""
        if event.to_state == State.COMPLETED:
            # The outcome artifact exactly as GetTask shows it (one source: wire.to_task).
            done = wire.to_task(task, context_id=self.context_id, outcome=masked_outcome(task), event=event)
            update = a2a_pb2.TaskArtifactUpdateEvent(
                task_id=str(task.id), context_id=self.context_id, artifact=done.artifacts[0], last_chunk=True
            )
            out += result_frame(self.request_id, {"artifactUpdate": json_format.MessageToDict(update)}, None)
        status = wire.status_update(task, event, context_id=self.context_id)
        return out + result_frame(
            self.request_id, {"statusUpdate": json_format.MessageToDict(status)}, event.state_version
        )

    def read(self) -> bytes:
        """One poll: the frames of the transitions after ``after`` (``done`` once the stream ends)."""
        try:
            with transaction.atomic():
                # The index of the unique (task, state_version) constraint serves this range read.
                log = TransitionEvent.objects.filter(task_id=self.task.id, state_version__gt=self.after)
                events = list(log.order_by("state_version")[:BATCH])
                if not events:
                    return b""
                task = self._still_allowed()
                if task is None:
                    self.done = True
                    return error_frame(self.request_id, RpcError(Code.TASK_NOT_FOUND, "No such task."))
                out = b""
                for index, event in enumerate(events):
                    out += self._frames_of(task, event)
                    self.after = event.state_version
                    last = index == len(events) - 1 and len(events) < BATCH
                    if _ends(reading(event.to_state).a2a, still_current=last):
                        self.done = True
                        break
                return out
        finally:
            release_connection()

    # -- the loop --

    def steps(self) -> Generator[bytes | float, None, None]:
        """What to send (bytes) and how long to sleep (float), until the stream ends."""
        limit = settings.A2A_STREAM_MAX_SECONDS
        yield self.opening or comment(f"resuming after version {self.after}")
        release_connection()  # the request's own connection, before the first sleep
        quiet_since = time.monotonic()
        while not self.done:
            if peer_gone(self.peer):
                return
            try:
                chunk = self.read()
            except Exception:
                logger.exception("A2A stream failed", extra={"task_id": str(self.task.id)})
                yield error_frame(
                    self.request_id,
                    RpcError(Code.INTERNAL_ERROR, "Internal error (logged); resubscribe with Last-Event-ID."),
                )
                return
            now = time.monotonic()
            if chunk:
                yield chunk
                quiet_since = now
            elif now - quiet_since >= HEARTBEAT_SECONDS:
                yield comment("keep-alive")
                quiet_since = now
            left = limit - (now - self.started)
            if self.done or left <= 0:
                return
            yield min(settings.A2A_STREAM_POLL_SECONDS, left)

    def __iter__(self) -> Iterator[bytes]:
        for step in self.steps():
            if isinstance(step, float):
                time.sleep(step)
            else:
                yield step

    async def __aiter__(self) -> AsyncIterator[bytes]:
        steps = self.steps()
        # Thread-sensitive: every poll runs on the request's own thread, as under WSGI.
        advance = sync_to_async(_next_step, thread_sensitive=True)
        try:
            while True:
                step = await advance(steps)
                if step is None:
                    return
                if isinstance(step, float):
                    await asyncio.sleep(step)
                else:
                    yield step
        finally:
            try:
                steps.close()
            except ValueError:  # canceled while a poll runs in its thread: it ends with that poll
                pass


def _next_step(steps: Iterator[bytes | float]) -> bytes | float | None:
    return next(steps, None)


class EventStreamResponse(StreamingHttpResponse):
    """``stream`` as ``text/event-stream``: iterated by a WSGI server, or asynchronously under ASGI
    (Django would otherwise read a synchronous iterator to its end before sending anything)."""

    def __init__(self, stream: TaskStream) -> None:
        super().__init__(iter(stream), content_type=CONTENT_TYPE)
        self.stream = stream
        self["Cache-Control"] = "no-store"
        self["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.stream:
            yield chunk

    def close(self) -> None:
        """The server closes every response it began, however it ended: the stream's slot goes back."""
        try:
            super().close()
        finally:
            self.stream.close()


# --- the two methods ---------------------------------------------------------------------------


def resume_point(call: Call, task: Task) -> int | None:
    """The version named by ``Last-Event-ID`` (None when absent); one this task never had is invalid."""
    raw = call.request.headers.get(RESUME_HEADER, "").strip()
    if not raw:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 10) or int(raw) > task.state_version:
        raise RpcError(
            Code.INVALID_PARAMS,
            f"{RESUME_HEADER} must be the id of an event this task's stream sent (a state_version).",
            {"field": RESUME_HEADER, "state_version": task.state_version},
        )
    return int(raw)


def open_stream(call: Call, task: Task, *, history_length: int = 0) -> EventStreamResponse:
    """The stream of ``task`` for this call: its snapshot first, or the transitions after
    ``Last-Event-ID``. Every refusal happens here, before the stream starts (a JSON-RPC error)."""
    after = resume_point(call, task)
    if not SLOTS.take():
        retry = max(1, round(settings.A2A_STREAM_POLL_SECONDS * 4))
        raise RpcError(
            Code.INTERNAL_ERROR,
            "This server has as many streams open as it serves; retry, or read the task with GetTask.",
            {"http_status": 503, "retry_after": retry},
        )
    try:
        context_id = wire.context_of(task)
        opening, done = b"", False
        if after is None:
            snapshot = methods.task_message(task, history_length=history_length)
            opening = result_frame(call.id, {"task": json_format.MessageToDict(snapshot)}, task.state_version)
            after = task.state_version
            done = _ends(reading(task.state).a2a, still_current=True)
        elif after == task.state_version:
            done = _ends(reading(task.state).a2a, still_current=True)
        stream = TaskStream(
            request_id=call.id,
            task=task,
            user=call.user,
            token_id=getattr(call.token, "pk", None),
            context_id=context_id,
            after=after,
            opening=opening,
            peer=call.request.META.get("gunicorn.socket"),
            done=done,
        )
        return EventStreamResponse(stream)
    except BaseException:
        SLOTS.give_back()
        raise


@method("SendStreamingMessage")
def send_streaming_message(call: Call) -> EventStreamResponse:
    """``SendMessage`` (the same start or answer, idempotent per ``messageId``), then the task's stream."""
    task, request = methods.send_message(call)
    history = request.configuration.history_length if request.HasField("configuration") else 0
    return open_stream(call, task, history_length=history)


@method("SubscribeToTask")
def subscribe_to_task(call: Call) -> EventStreamResponse:
    """The stream of one of the caller's tasks (another tenant's: ``TaskNotFound``)."""
    request = methods.parse(call.params, a2a_pb2.SubscribeToTaskRequest())
    return open_stream(call, methods.visible_task(call, request.id))
