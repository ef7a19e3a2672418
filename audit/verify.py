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

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.migrations.recorder import MigrationRecorder

from audit.chain import BrokenLink, created_at_of, verify_events, verify_takeovers
from audit.keys import anchor_public_keys, chain_keys
from audit.models import LeaseTakeover, Tombstone, TransitionEvent
from audit.tombstones import seal_problem, signature_problem

# The migration that gave events a key id: every event written since is keyed (audit.chain).
KEYED_MIGRATION = ("audit", "0008_event_key_id_tombstone")
# The migration that signed tombstones (audit.tombstones).
# The migration that chained lease takeovers: every takeover written since is keyed (audit.chain).
TAKEOVERS_CHAINED_MIGRATION = ("audit", "0011_lease_takeover_chain")
SIGNED_TOMBSTONES_MIGRATION = ("audit", "0010_anchor_doorbell_signed_tombstones")
UNKNOWN = object()  # keyed_since not read yet

# A check of what a verified chain says: (task id, events in version order, the task row's
# state) -> the first problem, or None.
PathCheck = Callable[[Any, Sequence[TransitionEvent], str], BrokenLink | None]


def in_force_since(migration: tuple[str, str]) -> datetime | None:
    """When ``migration`` was applied here (``django_migrations``); None if it was not."""
    app, name = migration
    recorder = MigrationRecorder(connections[DEFAULT_DB_ALIAS])
    return recorder.migration_qs.filter(app=app, name=name).values_list("applied", flat=True).first()


def keyed_since() -> datetime | None:
    """Since when every new event is keyed: legacy events after that are forgeries (``audit.chain``)."""
    return in_force_since(KEYED_MIGRATION)


def verify_task(task: Any, *, path: PathCheck | None = None, keyed: Any = UNKNOWN) -> BrokenLink | None:
    """First broken link in the chain of ``task`` (anything with an ``id``), or None.

    Reads the task's head and version afresh together with its events and its
    lease takeovers (checked against ``takeover_head``: ``audit.chain.verify_takeovers``), in one
    snapshot, so the answer describes one moment of a live system. A break is
    read again once, in a new snapshot, before it is reported: an auditor can
    trust a red result. ``path``: also check what the linked events say (the
    tasks layer's transition table). ``keyed``: ``keyed_since()``, when the
    caller verifies many chains and read it once.
    """
    since = keyed_since() if keyed is UNKNOWN else keyed
    link = _verify_once(task.id, path, since)
    return _verify_once(task.id, path, since) if link is not None else None


def _verify_once(task_id: Any, path: PathCheck | None, since: datetime | None) -> BrokenLink | None:
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
        events = list(TransitionEvent.objects.filter(task_id=task_id).order_by("state_version"))
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
    )
    if link is None and path is not None:
        link = path(task_id, events, row["state"])
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
