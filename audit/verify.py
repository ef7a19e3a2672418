"""Verifying a task's stored chain against its head, on a live system, with the configured keys.

Reads a task's head and its events in one snapshot, so a chain verified while
workers commit is never reported broken because the row and the log were read
at different moments; a break is read again before it is reported.

The links are this layer's (``audit.chain``); what the events may say — a
path through the transition table — is the tasks layer's, which passes its
check in as ``path`` (``tasks.audit_paths.verify_chain``): audit sits below
tasks and knows no states.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.migrations.recorder import MigrationRecorder
from django.utils import timezone

from audit.chain import BrokenLink, created_at_of, verify_events, verify_takeovers
from audit.keys import anchor_public_keys, chain_keys, current_chain_key
from audit.models import LeaseTakeover, Tombstone, TransitionEvent, VerifiedThrough
from audit.tombstones import seal_problem, signature_problem

# The migration that gave events a key id: every event written since is keyed (audit.chain).
KEYED_MIGRATION = ("audit", "0008_event_key_id_tombstone")
# The migration that signed tombstones (audit.tombstones).
# The migration that chained lease takeovers: every takeover written since is keyed (audit.chain).
TAKEOVERS_CHAINED_MIGRATION = ("audit", "0011_lease_takeover_chain")
SIGNED_TOMBSTONES_MIGRATION = ("audit", "0010_anchor_doorbell_signed_tombstones")
UNKNOWN = object()  # keyed_since not read yet

# A check of what a verified chain says: (task id, events in version order, the task row's
# state[, the already verified event they follow]) -> the first problem, or None.
PathCheck = Callable[..., BrokenLink | None]


def in_force_since(migration: tuple[str, str]) -> datetime | None:
    """When ``migration`` was applied here (``django_migrations``); None if it was not."""
    app, name = migration
    recorder = MigrationRecorder(connections[DEFAULT_DB_ALIAS])
    return recorder.migration_qs.filter(app=app, name=name).values_list("applied", flat=True).first()


def keyed_since() -> datetime | None:
    """Since when every new event is keyed: legacy events after that are forgeries (``audit.chain``)."""
    return in_force_since(KEYED_MIGRATION)


def verify_task(
    task: Any,
    *,
    path: PathCheck | None = None,
    keyed: Any = UNKNOWN,
    since_verified: bool = False,
    remember: bool = False,
) -> BrokenLink | None:
    """First broken link in the chain of ``task`` (anything with an ``id``), or None.

    Reads the task's head and version afresh together with its events and its
    lease takeovers (checked against ``takeover_head``: ``audit.chain.verify_takeovers``), in one
    snapshot, so the answer describes one moment of a live system. A break is
    read again once, in a new snapshot, before it is reported: an auditor can
    trust a red result. ``path``: also check what the linked events say (the
    tasks layer's transition table). ``keyed``: ``keyed_since()``, when the
    caller verifies many chains and read it once.

    ``since_verified``: start from the task's ``VerifiedThrough`` mark (the console's views), hashing
    only the events after it; see ``verified_base`` for what that still catches and what only the full
    verification does. ``remember``: on success, move the mark to the head just verified.
    """
    since = keyed_since() if keyed is UNKNOWN else keyed
    link = _verify_once(task.id, path, since, since_verified, remember)
    return _verify_once(task.id, path, since, since_verified, remember) if link is not None else None


MARK_PREFIX = "durable-agents/verified-through/v1\n"
# A mark older than this is not used: the next view verifies the whole chain again (and marks it anew),
# so an edit at or before a mark that leaves the stored hash is seen by a view within a day too.
MARK_MAX_AGE = timedelta(hours=24)


def _mark_mac(secret: bytes, task_id: Any, version: int, head: str, at: datetime) -> str:
    text = (
        f"{MARK_PREFIX}{task_id}\n{version}\n{head}\n{at.astimezone(UTC).isoformat(timespec='microseconds')}"
    )
    return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


class MarkBroken(Exception):
    """The event a genuine mark vouches for is not what it was when verified."""

    def __init__(self, link: BrokenLink) -> None:
        self.link = link


def verified_base(task_id: Any, state_version: int) -> tuple[TransitionEvent, datetime] | None:
    """The event the chain was last verified through and when it was last verified in full, when
    that mark can be trusted; else None.

    A mark counts only with a valid MAC under a chain key this process holds (one planted or moved
    forward without the key is ignored: the chain is then verified in full), and for ``MARK_MAX_AGE``
    after the chain was last verified in full. Then the event at its version must still carry the
    hash it had, and the task must not have gone below it (else ``MarkBroken``). So, against someone
    without the chain key, a view still catches any edit or deletion of an event after the mark, a
    rewritten hash of the marked event and a log cut below it. An edit of the fields of an event at
    or before the mark that leaves its stored hash is caught by the first view after the mark expires
    and by every full verification (the history's "verify the whole chain", ``verify_audit``, every
    JSON export); a rewrite made with the chain key shows against the anchors (``--against``).
    """
    mark = VerifiedThrough.objects.filter(task_id=task_id).first()
    secret = chain_keys().get(mark.key_id) if mark is not None else None
    if mark is None or secret is None:
        return None
    expected = _mark_mac(secret, task_id, mark.state_version, mark.hash, mark.verified_at)
    if not hmac.compare_digest(expected, mark.mac) or timezone.now() - mark.verified_at > MARK_MAX_AGE:
        return None
    if state_version < mark.state_version:
        raise MarkBroken(
            BrokenLink(
                task_id, None, f"verified through v{mark.state_version}, the task is now at v{state_version}"
            )
        )
    event = TransitionEvent.objects.filter(task_id=task_id, state_version=mark.state_version).first()
    if event is None or not hmac.compare_digest(event.hash.encode(), mark.hash.encode()):
        raise MarkBroken(
            BrokenLink(
                task_id,
                mark.state_version,
                f"missing or its hash changed since it was verified ({mark.verified_at:%Y-%m-%d %H:%M} UTC)",
            )
        )
    return event, mark.verified_at


def remember_verified(
    task_id: Any, state_version: int, head: str, *, in_full_at: datetime | None = None
) -> None:
    """Mark the chain of ``task_id`` verified through ``state_version`` (whose event's hash is ``head``).

    ``in_full_at``: when the whole chain was last verified, for a mark moved on incrementally (it keeps
    its age, so it still expires ``MARK_MAX_AGE`` after that); None: now, a verification in full.
    """
    if state_version < 1:
        return
    key, now = current_chain_key(), in_full_at or timezone.now()
    mark = VerifiedThrough(
        task_id=task_id,
        state_version=state_version,
        hash=head,
        key_id=key.id,
        mac=_mark_mac(key.secret, task_id, state_version, head, now),
        verified_at=now,
    )
    VerifiedThrough.objects.bulk_create(
        [mark],
        update_conflicts=True,
        unique_fields=["task_id"],
        update_fields=["state_version", "hash", "key_id", "mac", "verified_at"],
    )


def _verify_once(
    task_id: Any, path: PathCheck | None, since: datetime | None, since_verified: bool, remember: bool
) -> BrokenLink | None:
    # The task model through our own foreign key: audit sits below tasks and does not import it.
    task_model = TransitionEvent._meta.get_field("task").related_model
    with snapshot():
        row = (
            task_model._default_manager.filter(pk=task_id)
            .values("audit_head", "state_version", "state", "takeover_head")
            .first()
        )
        if row is None:
            return None  # gone with its history (retention): nothing left to disagree
        try:
            found = verified_base(task_id, row["state_version"]) if since_verified else None
        except MarkBroken as broken:
            return broken.link
        base, in_full_at = found if found is not None else (None, None)
        after = base.state_version if base is not None else 0
        events = list(
            TransitionEvent.objects.filter(task_id=task_id, state_version__gt=after).order_by("state_version")
        )
        # Written in id order under the task's row lock; a reordering breaks the prev_hash links anyway.
        takeovers = list(LeaseTakeover.objects.filter(task_id=task_id).order_by("id"))
    # When takeovers were chained: read only for a task with an unchained (legacy) takeover, which is rare.
    chained = in_force_since(TAKEOVERS_CHAINED_MIGRATION) if any(not t.key_id for t in takeovers) else None
    link = verify_takeovers(
        task_id, takeovers, head=row["takeover_head"], keys=chain_keys(), keyed_since=chained
    ) or verify_events(
        task_id,
        events,
        head=row["audit_head"],
        state_version=row["state_version"],
        keys=chain_keys(),
        keyed_since=since,
        after=base,
    )
    if link is None and path is not None:
        link = (
            path(task_id, events, row["state"], base)
            if base is not None
            else path(task_id, events, row["state"])
        )
    if link is None and remember and (base is None or base.state_version < row["state_version"]):
        # A mark moved on keeps its age: only a verification of the whole chain renews it.
        remember_verified(task_id, row["state_version"], row["audit_head"], in_full_at=in_full_at)
    return link


def tombstone_problems(*, chunk: int = 1000) -> Iterator[str]:
    """Every tombstone that does not hold up: a broken seal or signature, or none where one is due.

    A tombstone of a task created before tombstones were signed (audit migration 0010) may lack a
    signature; any other needs a valid one, so a task deleted by a chain-key holder between two
    anchors, with a tombstone of its own making, is reported even though no anchor knew it.
    """
    signed_since = in_force_since(SIGNED_TOMBSTONES_MIGRATION)
    keys, trusted = chain_keys(), anchor_public_keys()
    after = 0
    while True:
        page = list(Tombstone.objects.filter(id__gt=after).order_by("id")[:chunk])
        for stone in page:
            problem = seal_problem(stone, keys)
            if problem is None and (stone.signature or not _before(stone.task_id, signed_since)):
                problem = signature_problem(stone, trusted)
            if problem:
                yield f"task {stone.task_id} (deleted, tenant {stone.tenant_id}): {problem}"
        if len(page) < chunk:
            return
        after = page[-1].id


def _before(task_id: Any, moment: datetime | None) -> bool:
    """Whether the task was created before ``moment`` (by its UUIDv7 id); False when either is unknown."""
    created = created_at_of(task_id)
    return created is not None and moment is not None and created < moment


@contextmanager
def snapshot() -> Iterator[None]:
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
