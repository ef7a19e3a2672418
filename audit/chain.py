"""Hash chain over a task's transition events, and its verification.

``hash = SHA-256(prev_hash || canonical JSON of the event's fields)``; the
first event links to ``GENESIS``. Canonical JSON: sorted keys, no whitespace,
datetimes as ISO 8601 in UTC with microseconds, UUIDs as strings.

Verification reads a task's head and its events in one snapshot, so a chain
verified while workers commit is never reported broken because the row and
the log were read at different moments.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections, transaction

GENESIS = "0" * 64

# The fields a hash covers, in the order shown to auditors. Everything an event
# asserts is covered; only the row id and the hash itself are not.
HASHED_FIELDS = (
    "task_id",
    "tenant_id",
    "state_version",
    "from_state",
    "to_state",
    "trigger",
    "actor_kind",
    "actor_id",
    "reason",
    "reason_code",
    "attempt",
    "policy_version",
    "parent_id",
    "trace_id",
    "created_at",
)
# Fields added after events were first written: hashed only when non-empty, so
# every event written before a field existed keeps exactly the hash it was given.
OPTIONAL_HASHED_FIELDS = ("checkpoint_digest",)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, UUID):
        return str(value)
    return value


def event_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    covered = {name: _plain(fields[name]) for name in HASHED_FIELDS}
    covered.update({name: fields[name] for name in OPTIONAL_HASHED_FIELDS if fields.get(name)})
    body = json.dumps(
        covered,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256((prev_hash + body).encode()).hexdigest()


@dataclass(frozen=True)
class BrokenLink:
    task_id: UUID
    state_version: int | None
    problem: str

    def __str__(self) -> str:
        at = f"v{self.state_version}" if self.state_version is not None else "head"
        return f"task {self.task_id} {at}: {self.problem}"


def verify_events(
    task_id: UUID, events: Iterable[Any], *, head: str, state_version: int
) -> BrokenLink | None:
    """First broken link in ``events`` (ordered by version), or None.

    ``head`` and ``state_version`` are the task row's chain head and version,
    so a deleted newest event is caught as well as an edited or missing one.
    """
    prev, expected_version = GENESIS, 1
    for event in events:
        if event.state_version != expected_version:
            return BrokenLink(task_id, expected_version, f"missing event (found v{event.state_version} next)")
        if event.prev_hash != prev:
            return BrokenLink(task_id, event.state_version, "prev_hash does not match the previous event")
        fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
        if event_hash(prev, fields) != event.hash:
            return BrokenLink(task_id, event.state_version, "contents do not match the stored hash")
        prev, expected_version = event.hash, expected_version + 1
    if expected_version - 1 != state_version:
        return BrokenLink(task_id, None, f"log ends at v{expected_version - 1}, task is at v{state_version}")
    if prev != head:
        return BrokenLink(task_id, None, "task's chain head does not match the newest event")
    return None


def verify_task(task: Any) -> BrokenLink | None:
    """First broken link in the chain of ``task`` (anything with an ``id``), or None.

    Reads the task's head and version afresh together with its events, in one
    snapshot, so the answer describes one moment of a live system. A break is
    read again once, in a new snapshot, before it is reported: an auditor can
    trust a red result.
    """
    link = _verify_once(task.id)
    return _verify_once(task.id) if link is not None else None


def _verify_once(task_id: Any) -> BrokenLink | None:
    from audit.models import TransitionEvent

    # The task model through our own foreign key: audit sits below tasks and does not import it.
    task_model = TransitionEvent._meta.get_field("task").related_model
    with _snapshot():
        row = task_model._default_manager.filter(pk=task_id).values("audit_head", "state_version").first()
        if row is None:
            return None  # gone with its history (retention): nothing left to disagree
        events = list(TransitionEvent.objects.filter(task_id=task_id).order_by("state_version"))
    return verify_events(task_id, events, head=row["audit_head"], state_version=row["state_version"])


@contextmanager
def _snapshot() -> Iterator[None]:
    """A read-only transaction whose reads all see one snapshot.

    PostgreSQL's default READ COMMITTED gives every statement its own snapshot:
    a transition committing between reading the task row and reading its log
    would look like an extra event. REPEATABLE READ fixes the snapshot at the
    first read. Inside a caller's transaction the isolation level can no
    longer be chosen; the caller's transaction is then the unit (and a break is
    re-read before it is reported). SQLite serializes writers: it needs nothing.
    """
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield
