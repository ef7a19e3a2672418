"""Hash chain over a task's transition events: the link hashes, and checking a chain's links.

``hash = HMAC-SHA256(key, prev_hash || canonical JSON of the event's fields)``
with the key named by the event's ``key_id``; the first event links to
``GENESIS``. Canonical JSON is ``audit.canonical.V1``: sorted keys, no
whitespace, text as UTF-8, datetimes as ISO 8601 in UTC with microseconds,
UUIDs as strings.

Why keyed: an unkeyed hash can be recomputed by anyone who can write the
table, so a database owner could edit an event, rehash forward, move the
task's head and nothing would show. The key lives in the environment
(``AUDIT_HMAC_KEYS``, read by ``audit.keys``), never in the database.

Events written before the chain was keyed have ``key_id == ""`` and keep
their plain ``SHA-256(prev_hash || canonical JSON)``. A chain may go from
legacy to keyed, never back: a legacy event after a keyed one is a break, so
whoever rewrites the tail of a chain without the key cannot pass it off as
old history. And legacy events exist only from before the chain was keyed
(``keyed_since``: when audit migration 0008 gave events a key id): a legacy
event written since, or in the chain of a task created since, is a break. A
task's creation time is read from its id (a UUIDv7, ``tasks.ids``), which the
hashes cover and every row of the task refers to, so a rewrite cannot backdate
it as it could the events' ``created_at``.

Pure functions, no database and no settings: keys are passed in, so
benchmarks and offline checks of an export use them outside Django.
Reading a chain from the database to verify it is ``audit.verify``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from audit import canonical

GENESIS = "0" * 64
LEGACY = ""  # the key id of events written before the chain was keyed

# The fields a hash covers, in the order shown to auditors. Everything an event
# asserts is covered; only the row id, the key id and the hash itself are not
# (a changed key id makes the hash be checked with another key, and fail).
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


def _message(prev_hash: str, fields: Mapping[str, Any]) -> str:
    covered = {name: fields[name] for name in HASHED_FIELDS}
    covered.update({name: fields[name] for name in OPTIONAL_HASHED_FIELDS if fields.get(name)})
    return prev_hash + canonical.dumps(covered, version=canonical.V1)


def event_hash(prev_hash: str, fields: Mapping[str, Any]) -> str:
    """The legacy, unkeyed link: SHA-256 of ``prev_hash`` and the canonical fields (``key_id == ""``)."""
    return canonical.digest_text(_message(prev_hash, fields))


def _hmac(message: str, secret: bytes) -> str:
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def keyed_hash(prev_hash: str, fields: Mapping[str, Any], secret: bytes) -> str:
    """The keyed link: HMAC-SHA256 under ``secret`` of ``prev_hash`` and the canonical fields (hex)."""
    return _hmac(_message(prev_hash, fields), secret)


def link_hash(prev_hash: str, fields: Mapping[str, Any], *, key_id: str, keys: Mapping[str, bytes]) -> str:
    """The hash an event with ``key_id`` must carry: legacy for ``""``, else keyed with ``keys[key_id]``.

    Raises ``KeyError`` for a key id ``keys`` does not hold.
    """
    if key_id == LEGACY:
        return event_hash(prev_hash, fields)
    return keyed_hash(prev_hash, fields, keys[key_id])


def created_at_of(task_id: UUID | str) -> datetime | None:
    """When a task was created, from its UUIDv7 id (milliseconds); None for an id of another version."""
    uuid = task_id if isinstance(task_id, UUID) else UUID(str(task_id))
    if uuid.version != 7:
        return None
    return datetime.fromtimestamp((uuid.int >> 80) / 1000, tz=UTC)


def _legacy_refused(task_id: UUID, event: Any, keyed_since: datetime | None) -> str | None:
    """Why a legacy event cannot be genuine once the chain was keyed at ``keyed_since``; None if it can."""
    if keyed_since is None:
        return None
    created = created_at_of(task_id)
    if created is not None and created >= keyed_since:
        return (
            f"unkeyed (legacy) event in the chain of a task created {created:%Y-%m-%d %H:%M:%S} UTC, after "
            f"the chain was keyed ({keyed_since:%Y-%m-%d %H:%M:%S} UTC)"
        )
    if event.created_at >= keyed_since:
        return (
            f"unkeyed (legacy) event written after the chain was keyed ({keyed_since:%Y-%m-%d %H:%M:%S} UTC)"
        )
    return None


def link_problem(
    event: Any, keys: Mapping[str, bytes], keyed_since: Callable[[], datetime | None]
) -> str | None:
    """Why ``event`` alone is not what a chain-key holder wrote; None when it is (its link is not
    followed to the previous event: ``verify_events`` does that).

    Keyed: its key id must be one of ``keys`` and its hash the keyed link of its fields. Legacy
    (unkeyed): anyone can compute that hash, so only one that can predate the keying passes
    (``keyed_since``, called only for a legacy event: it reads the database).
    """
    if event.key_id == LEGACY:
        return _legacy_refused(event.task_id, event, keyed_since())
    if event.key_id not in keys:
        return f"its event is keyed with key id {event.key_id!r}, which AUDIT_HMAC_KEYS does not hold"
    fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
    link = link_hash(event.prev_hash, fields, key_id=event.key_id, keys=keys)
    if not hmac.compare_digest(link.encode(), str(event.hash).encode()):
        return "its event's hash is not the keyed link of its fields (written without the chain key)"
    return None


@dataclass(frozen=True)
class BrokenLink:
    task_id: UUID
    state_version: int | None
    problem: str

    def __str__(self) -> str:
        at = f"v{self.state_version}" if self.state_version is not None else "head"
        return f"task {self.task_id} {at}: {self.problem}"


def verify_events(
    task_id: UUID,
    events: Iterable[Any],
    *,
    head: str,
    state_version: int,
    keys: Mapping[str, bytes] | None = None,
    keyed_since: datetime | None = None,
    after: Any = None,
) -> BrokenLink | None:
    """First broken link in ``events`` (ordered by version), or None.

    ``after``: an event already verified (``audit.verify``'s verified-through point); ``events`` then
    start at the version after it and link from its hash, and only they are hashed.

    ``head`` and ``state_version`` are the task row's chain head and version,
    so a deleted newest event is caught as well as an edited or missing one.
    ``keys`` maps key ids to secrets (``audit.keys.chain_keys``); without it
    only a wholly legacy chain can verify. An event without a ``key_id``
    attribute (an old export) is legacy. ``keyed_since``: when the chain was
    keyed (``audit.verify.keyed_since``); a legacy event after it, or in the
    chain of a task created after it, is a break. None (an offline check of an
    export, which does not know): legacy events are judged by their links alone.
    """
    keys = keys or {}
    prev, expected_version, keyed_from = GENESIS, 1, None  # keyed_from: the chain's first keyed version
    if after is not None:
        prev, expected_version = after.hash, after.state_version + 1
        keyed_from = after.state_version if (getattr(after, "key_id", LEGACY) or LEGACY) != LEGACY else None
    for event in events:
        key_id = getattr(event, "key_id", LEGACY) or LEGACY
        if event.state_version != expected_version:
            return BrokenLink(task_id, expected_version, f"missing event (found v{event.state_version} next)")
        if event.prev_hash != prev:
            return BrokenLink(task_id, event.state_version, "prev_hash does not match the previous event")
        if key_id == LEGACY and keyed_from is not None:
            return BrokenLink(
                task_id,
                event.state_version,
                f"unkeyed (legacy) event after keyed v{keyed_from}: a chain never goes back to unkeyed",
            )
        if key_id == LEGACY and (refused := _legacy_refused(task_id, event, keyed_since)):
            return BrokenLink(task_id, event.state_version, refused)
        if key_id != LEGACY and key_id not in keys:
            known = ", ".join(sorted(keys)) or "none"
            return BrokenLink(
                task_id,
                event.state_version,
                f"signed with key id {key_id!r}, which AUDIT_HMAC_KEYS does not hold (known: {known})",
            )
        fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
        expected = link_hash(prev, fields, key_id=key_id, keys=keys)
        if not hmac.compare_digest(expected.encode(), str(event.hash).encode()):
            return BrokenLink(task_id, event.state_version, "contents do not match the stored hash")
        if key_id != LEGACY and keyed_from is None:
            keyed_from = event.state_version
        prev, expected_version = event.hash, expected_version + 1
    if expected_version - 1 != state_version:
        return BrokenLink(task_id, None, f"log ends at v{expected_version - 1}, task is at v{state_version}")
    if prev != head:
        return BrokenLink(task_id, None, "task's chain head does not match the newest event")
    return None


# --- Lease takeovers: a second chain per task ------------------------------------------------------
#
# A takeover is not a transition (it moves no version: the old holder must still see ``LeaseLost``,
# open cancel requests stay current), so it is not an event of the chain above. Each task's takeovers
# form their own keyed chain, same key, same canonical JSON, head on the task row (``takeover_head``).
# ``record`` names the kind of row in what is hashed, so no takeover link can pass as an event's.

TAKEOVER_RECORD = "lease_takeover"
TAKEOVER_FIELDS = (
    "task_id",
    "worker_id",
    "token",
    "previous_worker_id",
    "stale_token",
    "previous_heartbeat_at",
    "previous_expires_at",
    "taken_at",
)


def takeover_hash(prev_hash: str, takeover: Any, secret: bytes) -> str:
    """The keyed link of a takeover row: HMAC-SHA256 of ``prev_hash`` and its canonical fields."""
    covered = {name: getattr(takeover, name) for name in TAKEOVER_FIELDS} | {"record": TAKEOVER_RECORD}
    return _hmac(prev_hash + canonical.dumps(covered, version=canonical.V1), secret)


def verify_takeovers(
    task_id: UUID,
    takeovers: Iterable[Any],
    *,
    head: str,
    keys: Mapping[str, bytes],
    keyed_since: datetime | None,
) -> BrokenLink | None:
    """First problem of a task's takeover chain (rows in the order written), or None.

    Keyed rows link from ``GENESIS`` by ``prev_hash`` and carry the keyed link of their fields under a
    key of ``keys``; the newest one's hash is ``head`` (the task row's ``takeover_head``; "" while the
    task had none), so a deleted newest row, or all of them, is caught. Unkeyed rows (``key_id == ""``)
    are the takeovers written before they were chained: accepted only from before ``keyed_since`` (audit
    migration 0011) for a task created before it, and never after a keyed one.
    """
    prev, seen_keyed = GENESIS, False
    for number, row in enumerate(takeovers, start=1):
        at = f"takeover #{number} (token {row.stale_token} -> {row.token})"
        if row.key_id == LEGACY:
            created = created_at_of(task_id)
            if seen_keyed:
                return BrokenLink(task_id, None, f"{at}: unchained (legacy) after a chained takeover")
            if keyed_since is not None and (
                row.taken_at >= keyed_since or (created is not None and created >= keyed_since)
            ):
                return BrokenLink(task_id, None, f"{at}: unchained, but written after takeovers were chained")
            continue
        if row.key_id not in keys:
            return BrokenLink(
                task_id, None, f"{at}: keyed with key id {row.key_id!r}, not in AUDIT_HMAC_KEYS"
            )
        if row.prev_hash != prev:
            return BrokenLink(task_id, None, f"{at}: prev_hash does not match the previous takeover")
        expected = takeover_hash(prev, row, keys[row.key_id])
        if not hmac.compare_digest(expected.encode(), str(row.hash).encode()):
            return BrokenLink(
                task_id, None, f"{at}: contents do not match the stored hash (not the chain key's)"
            )
        prev, seen_keyed = row.hash, True
    if (prev if seen_keyed else "") != head:
        return BrokenLink(task_id, None, "task's takeover head does not match the newest takeover")
    return None
