"""Conversation memory for Agents SDK agents, kept in our database: sealed, per tenant, under retention.

An SDK *session* is the list of input items (messages, tool calls and their outputs) a run starts
from and adds to. Here it is a tenant's ``session_id`` and its ``runtime.AgentSessionItem`` rows in
``position`` order. Two ways in:

- the four sync functions, ``read``, ``append``, ``pop`` and ``clear``: what our agent adapter calls.
  It replays a run from our records at every step, so it never hands a session to the SDK's
  ``Runner``: it reads the items once before a run and appends the run's new ones inside the
  transaction that completes the agent step (one of ``tasks.transitions.advance``'s ``also=``
  writes, ``functools.partial(append, …)``). Appending there is what makes it exactly once: a step
  whose transaction did not commit (a crash, a stale version) left no item, and the replayed step
  appends them again; one that did commit is not replayed.
- ``DurableSession``, the SDK's ``SessionABC`` over the same functions, for code that drives the SDK
  itself (``Runner.run(agent, text, session=DurableSession(tenant_id, "chat-42"))``).

What every item is held to:

- a JSON object (no NaN or infinity; keys as JSON writes them, text) of at most
  ``AGENT_SESSION_ITEM_MAX_BYTES`` as canonical JSON; anything else refuses the whole batch
  (``SessionItemRefused``) before a row is written;
- sealed whole (``audit.sealing``) to the place ``("agent_session", tenant, session, position, row
  id)``: no conversation text is stored in clear, and a token copied into another tenant's session,
  or another place in the same one, is refused when read (``SessionItemUnreadable``);
- tenant-scoped: every query names the tenant, so tenant B asking for tenant A's ``session_id`` sees
  an empty session of its own;
- erased by retention with the task that wrote it (``task``; archiving erases the envelope in place,
  deleting the task deletes the row). An erased item is no longer part of the conversation: ``read``
  skips it and ``pop`` drops it on the way to the last one still readable.

Two appenders of one session (two workers, or a worker and a person's chat) are serialised by a
transaction-scoped advisory lock on (tenant, session) on PostgreSQL, taken before the last position
is read and held until the caller's transaction ends; the unique (tenant, session, position)
constraint is the backstop. SQLite (the demo) writes one transaction at a time anyway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar, cast
from uuid import UUID

from agents.items import TResponseInputItem
from agents.memory import SessionABC, SessionSettings
from agents.memory.session_settings import resolve_session_limit
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, models, transaction
from django.db.models.fields.json import KT
from django.utils import timezone

from audit import canonical, sealing
from runtime.models import AgentSessionItem
from tasks.ids import uuid7
from tasks.models import Task

SESSION_ID_MAX = 200  # AgentSessionItem.session_id's length
# The advisory lock's first key: a number of our own, so the two-key lock (tenant and session hashed
# together as the second) cannot meet another user of advisory locks. The one-key locks of
# tasks.liveness live in a separate space (PostgreSQL never mixes the one- and two-key forms).
LOCK_CLASS = 0x5E5510
T = TypeVar("T")


class SessionError(ValueError):
    """A call this module refuses (its arguments): nothing was stored or removed."""


class SessionItemRefused(SessionError):
    """An item that is not a JSON object, or is larger than ``AGENT_SESSION_ITEM_MAX_BYTES``.

    ``index`` is its place in the batch it came in (none of which was stored); ``reason`` says why,
    never quoting the item (it may be someone's words).
    """

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"session item {index}: {reason}; nothing of the batch was stored")
        self.index = index
        self.reason = reason


class SessionItemUnreadable(Exception):
    """A stored item that cannot be opened: its key is retired, or the token was altered or copied in
    from another place. ``problem`` is the ``sealing.Unopenable`` problem; nothing was removed."""

    def __init__(self, position: int, cause: sealing.Unopenable) -> None:
        super().__init__(f"the session item at position {position} cannot be opened: {cause}")
        self.position = position
        self.problem = cause.problem


# --- the sync functions ------------------------------------------------------------------------------


def end(tenant_id: int, session_id: str) -> int:
    """The position the session's next item takes (0 for an empty session): with ``read(before=)``, a
    mark that reads the same items however the session grows later."""
    _check_session_id(session_id)
    last = AgentSessionItem.objects.filter(tenant_id=tenant_id, session_id=session_id).aggregate(
        last=models.Max("position")
    )["last"]
    return 0 if last is None else last + 1


def read(
    tenant_id: int, session_id: str, limit: int | None = None, *, before: int | None = None
) -> list[dict[str, Any]]:
    """The session's items, opened, oldest first; with ``limit``, only the latest ``limit`` of them;
    with ``before``, only those at earlier positions (``end`` gave the mark).

    Items retention erased are not counted. An empty list for a session nothing was written to (or a
    session of another tenant). Raises ``SessionError`` for a bad ``session_id`` or a negative
    ``limit``, ``SessionItemUnreadable`` for an item that cannot be opened.
    """
    _check_session_id(session_id)
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise SessionError(f"limit must be None or a whole number of at least 0, not {limit!r}")
    if limit == 0 or (before is not None and before <= 0):
        return []  # nothing to read: positions start at 0
    readable = _readable(tenant_id, session_id)
    if before is not None:
        readable = readable.filter(position__lt=before)
    rows = readable.order_by("-position").values_list("id", "position", "item")
    latest = list(rows if limit is None else rows[:limit])
    return [_opened(tenant_id, session_id, *row) for row in reversed(latest)]


def append(tenant_id: int, session_id: str, items: Sequence[object], task: Task | UUID | None = None) -> None:
    """Add ``items`` at the end of the session, in order, each sealed to its place.

    Call it inside the transaction that completes the step that produced the items: it commits or
    rolls back with it (it only opens a savepoint of its own), which is what makes a replayed step
    append once. Outside a transaction it is one. ``task``: the task whose run wrote them (a ``Task``
    or its id, of this tenant), so that retention erases and deletes them with it.

    Raises ``SessionItemRefused`` (an item not a JSON object, or too large), ``SessionError`` (a bad
    ``session_id``, ``items`` not a list, a task of another tenant or none); nothing is written then.
    """
    _check_session_id(session_id)
    if isinstance(items, str | bytes | dict) or not isinstance(items, Sequence):
        raise SessionError(f"items must be a list of JSON objects, not {type(items).__name__}")
    values = [_checked(index, item) for index, item in enumerate(items)]
    task_id = _task_of(tenant_id, task)
    if not values:
        return
    now = timezone.now()
    with transaction.atomic():
        _lock(tenant_id, session_id)
        last = AgentSessionItem.objects.filter(tenant_id=tenant_id, session_id=session_id).aggregate(
            last=models.Max("position")
        )["last"]
        start = 0 if last is None else last + 1
        rows = []
        ring = sealing.keyring()
        for offset, value in enumerate(values):
            row_id, position = uuid7(), start + offset
            sealed = sealing.seal(value, _place(tenant_id, session_id, position, row_id), ring)
            rows.append(
                AgentSessionItem(
                    id=row_id,
                    tenant_id=tenant_id,
                    session_id=session_id,
                    position=position,
                    item=sealed,
                    task_id=task_id,
                    created_at=now,
                )
            )
        AgentSessionItem.objects.bulk_create(rows)


def pop(tenant_id: int, session_id: str) -> dict[str, Any] | None:
    """Remove the session's last item and return it opened; None when the session is empty.

    Erased items above it go with it (they are no longer part of the conversation). Raises
    ``SessionItemUnreadable`` when the last item cannot be opened: then nothing is removed.
    """
    _check_session_id(session_id)
    with transaction.atomic():
        _lock(tenant_id, session_id)
        newest = AgentSessionItem.objects.filter(tenant_id=tenant_id, session_id=session_id).order_by(
            "-position"
        )
        while (row := newest.values_list("id", "position", "item").first()) is not None:
            row_id, position, item = row
            AgentSessionItem.objects.filter(pk=row_id).delete()
            if not _erased(item):
                # Opened after the delete, in the same transaction: an item that cannot be opened
                # raises here and the delete rolls back with it.
                return _opened(tenant_id, session_id, row_id, position, item)
    return None


def clear(tenant_id: int, session_id: str) -> None:
    """Remove every item of the session (of this tenant only)."""
    _check_session_id(session_id)
    with transaction.atomic():
        _lock(tenant_id, session_id)
        AgentSessionItem.objects.filter(tenant_id=tenant_id, session_id=session_id).delete()


# --- the SDK's session -------------------------------------------------------------------------------


class DurableSession(SessionABC):
    """An Agents SDK session over ``read``/``append``/``pop``/``clear``, for one tenant's session.

    For code that drives the SDK's ``Runner`` itself; each call runs the sync function in Django's
    thread for async callers (``sync_to_async``), so it may be used from any event loop. ``task``:
    the task whose run this is, if any, so that the items it adds go with that task under retention.
    ``session_settings.limit`` is the default for ``get_items`` (the SDK's convention).

    A write the caller stops waiting for (the run is cancelled) still finishes before the
    cancellation is passed on, so whoever catches it knows the items are written or not: never
    "perhaps, later".
    """

    def __init__(
        self,
        tenant_id: int,
        session_id: str,
        *,
        task: Task | UUID | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        _check_session_id(session_id)
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.task = task
        self.session_settings = session_settings or SessionSettings()

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        effective = resolve_session_limit(limit, self.session_settings)
        items = await sync_to_async(read)(self.tenant_id, self.session_id, effective)
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await _to_the_end(sync_to_async(append)(self.tenant_id, self.session_id, list(items), self.task))

    async def pop_item(self) -> TResponseInputItem | None:
        item = await _to_the_end(sync_to_async(pop)(self.tenant_id, self.session_id))
        return cast(TResponseInputItem | None, item)

    async def clear_session(self) -> None:
        await _to_the_end(sync_to_async(clear)(self.tenant_id, self.session_id))


async def _to_the_end(write: Awaitable[T]) -> T:
    """``write``'s result, waited for even when the caller is cancelled meanwhile; a cancellation is
    raised only once the write is over (its own error, if it failed, comes first)."""
    running = asyncio.ensure_future(write)
    cancelled: asyncio.CancelledError | None = None
    while not running.done():
        try:
            await asyncio.wait({running})
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is not None and running.exception() is None:
        raise cancelled
    return running.result()


# --- helpers -----------------------------------------------------------------------------------------


def _check_session_id(session_id: object) -> None:
    if not isinstance(session_id, str) or not session_id.strip() or len(session_id) > SESSION_ID_MAX:
        raise SessionError(f"session_id must be non-blank text of at most {SESSION_ID_MAX} characters")


def _checked(index: int, item: object) -> dict[str, Any]:
    """``item`` as it will be read back (plain JSON), or ``SessionItemRefused``."""
    if not isinstance(item, dict):
        raise SessionItemRefused(index, f"a JSON object is expected, not {type(item).__name__}")
    try:
        # Strict JSON: what a model API would accept. The text round trip gives the value exactly as
        # a read will return it (tuples as lists), so the seal holds what the SDK gets back.
        value = json.loads(json.dumps(item, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise SessionItemRefused(index, f"not JSON ({type(exc).__name__})") from None
    size = len(canonical.dumps(value, version=canonical.V1).encode())
    limit: int = settings.AGENT_SESSION_ITEM_MAX_BYTES
    if size > limit:
        raise SessionItemRefused(index, f"{size} bytes, more than AGENT_SESSION_ITEM_MAX_BYTES ({limit})")
    return cast(dict[str, Any], value)


def _task_of(tenant_id: int, task: Task | UUID | None) -> UUID | None:
    """The id of the task ``append`` files the items under, checked to be this tenant's."""
    if task is None:
        return None
    if isinstance(task, Task):
        owner, task_id = task.tenant_id, task.pk
    else:
        task_id = task
        found = Task.objects.filter(pk=task).values_list("tenant_id", flat=True).first()
        if found is None:
            raise SessionError(f"no task {task}")
        owner = found
    if owner != tenant_id:
        # Its retention would erase another tenant's conversation: refused, not filed under it.
        raise SessionError(f"task {task_id} is not of tenant {tenant_id}")
    return task_id


def _place(tenant_id: int, session_id: str, position: int, row_id: UUID) -> sealing.Place:
    return ("agent_session", str(tenant_id), session_id, position, str(row_id))


def _lock(tenant_id: int, session_id: str) -> None:
    """Serialise this session's writers until the surrounding transaction ends (PostgreSQL only)."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        # The session as one JSON text, so no tenant and session pair spells another's; hash
        # collisions only make two sessions wait for each other.
        key = json.dumps([tenant_id, session_id])
        cursor.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [LOCK_CLASS, key])


def _erased(item: Any) -> bool:
    return sealing.is_envelope(item) and item.get(sealing.MARK) == sealing.ERASED


def _readable(tenant_id: int, session_id: str) -> models.QuerySet[AgentSessionItem]:
    """The session's rows retention has not erased (an erased envelope's key id is ``erased``)."""
    return (
        AgentSessionItem.objects.filter(tenant_id=tenant_id, session_id=session_id)
        .alias(key_id=KT(f"item__{sealing.MARK}"))
        .exclude(key_id=sealing.ERASED)
    )


def _opened(tenant_id: int, session_id: str, row_id: UUID, position: int, item: Any) -> dict[str, Any]:
    try:
        value = sealing.open_envelope(
            item, _place(tenant_id, session_id, position, row_id), where="its envelope"
        )
    except sealing.Unopenable as exc:
        raise SessionItemUnreadable(position, exc) from None
    if not isinstance(value, dict):
        raise SessionItemUnreadable(
            position,
            sealing.Unopenable(
                sealing.Unopenable.MALFORMED,
                key_id=str(item.get(sealing.MARK, "")),
                where="its envelope",
                message="the sealed value is not an item",
            ),
        )
    return cast(dict[str, Any], value)
