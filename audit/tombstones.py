"""Tombstones: the sealed record a deleted task leaves behind (``audit.models.Tombstone``).

Retention (the owner role's path, README "Database roles") writes one per task
it deletes, in the same transaction, with ``make_tombstone``. An anchor lists
tombstones, and ``verify_audit --against`` accepts a task missing from the
database only when a tombstone accounts for it: sealed with a chain key, at
the anchored version or later, and with the anchored head when at that version.
The seal is an HMAC with the chain key over the canonical JSON of the row, so a
tombstone cannot be planted by someone who can write the table but does not
hold ``AUDIT_HMAC_KEYS``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from audit import canonical
from audit.keys import current_chain_key
from audit.models import Tombstone


@contextmanager
def retention_path() -> Iterator[None]:
    """A transaction in which the append-only guards let DELETE through, for the owner role only.

    Sets ``audit.retention`` for this transaction alone (``SET LOCAL``); the guard
    (audit migration 0009) also requires the session's role to own the table, so
    under the application's role every DELETE is still refused. Insert the
    tombstone (``make_tombstone``) and delete a task's rows, children first, inside.
    """
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL audit.retention = 'on'")
        yield


SEALED_FIELDS = ("task_id", "tenant_id", "task_type", "state_version", "audit_head", "deleted_at", "reason")


def _mac(fields: Mapping[str, Any], secret: bytes) -> str:
    text = canonical.dumps({name: fields[name] for name in SEALED_FIELDS}, version=canonical.V1)
    return hmac.new(secret, b"tombstone\n" + text.encode(), hashlib.sha256).hexdigest()


def make_tombstone(
    *,
    task_id: UUID,
    tenant_id: int,
    task_type: str,
    state_version: int,
    audit_head: str,
    reason: str,
    deleted_at: datetime | None = None,
) -> Tombstone:
    """An unsaved, sealed tombstone for a task about to be deleted (the caller inserts it)."""
    fields: dict[str, Any] = {
        "task_id": task_id,
        "tenant_id": tenant_id,
        "task_type": task_type,
        "state_version": state_version,
        "audit_head": audit_head,
        "deleted_at": deleted_at or timezone.now(),
        "reason": reason,
    }
    key = current_chain_key()
    return Tombstone(**fields, key_id=key.id, mac=_mac(fields, key.secret))


def tombstone_problem(tombstone: Any, keys: Mapping[str, bytes]) -> str | None:
    """Why ``tombstone`` cannot be trusted (unknown key, broken seal), or None."""
    secret = keys.get(tombstone.key_id)
    if secret is None:
        return f"tombstone sealed with key id {tombstone.key_id!r}, which AUDIT_HMAC_KEYS does not hold"
    fields = {name: getattr(tombstone, name) for name in SEALED_FIELDS}
    if not hmac.compare_digest(_mac(fields, secret).encode(), str(tombstone.mac).encode()):
        return "tombstone's seal does not match its contents"
    return None
