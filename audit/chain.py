"""Hash chain over a task's transition events: the hash, and checking a chain's links.

``hash = SHA-256(prev_hash || canonical JSON of the event's fields)``; the
first event links to ``GENESIS``. Canonical JSON is ``audit.canonical.V1``:
sorted keys, no whitespace, text as UTF-8, datetimes as ISO 8601 in UTC with
microseconds, UUIDs as strings.

Pure functions, no database: benchmarks and exports use them outside Django.
Reading a chain from the database to verify it is ``audit.verify``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from audit import canonical

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


def event_hash(prev_hash: str, fields: dict[str, Any]) -> str:
    covered = {name: fields[name] for name in HASHED_FIELDS}
    covered.update({name: fields[name] for name in OPTIONAL_HASHED_FIELDS if fields.get(name)})
    return canonical.digest_text(prev_hash + canonical.dumps(covered, version=canonical.V1))


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
