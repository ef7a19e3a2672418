"""Verifying a task's stored chain against its head, on a live system, with the configured keys.

Reads a task's head and its events in one snapshot, so a chain verified while
workers commit is never reported broken because the row and the log were read
at different moments; a break is read again before it is reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from audit.chain import BrokenLink, verify_events
from audit.keys import chain_keys
from audit.models import TransitionEvent


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
    # The task model through our own foreign key: audit sits below tasks and does not import it.
    task_model = TransitionEvent._meta.get_field("task").related_model
    with snapshot():
        row = task_model._default_manager.filter(pk=task_id).values("audit_head", "state_version").first()
        if row is None:
            return None  # gone with its history (retention): nothing left to disagree
        events = list(TransitionEvent.objects.filter(task_id=task_id).order_by("state_version"))
    return verify_events(
        task_id, events, head=row["audit_head"], state_version=row["state_version"], keys=chain_keys()
    )


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
