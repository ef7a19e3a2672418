"""Tombstones: the signed record a deleted task leaves behind (``audit.models.Tombstone``).

Retention (the owner role's path, docs/operating/tamper-evidence.md#database-roles) writes one per task
it deletes, in the same transaction, with ``make_tombstone``. An anchor lists
tombstones, and ``verify_audit --against`` accepts a task missing from the
database only when a tombstone accounts for it: signed with a trusted anchor
key, at the anchored version or later, and with the anchored head when at that
version.

Why the anchor's Ed25519 key signs them, not the chain key: the chain key is
in every web and worker process (each writes events), so whoever holds it — a
database superuser who read it from an app host, say — could delete a live
task and seal a tombstone for it that looked like retention's. The anchor
signing key (``AUDIT_ANCHOR_KEY``) is held only where anchors are written and
deletions run (the owner's maintenance job; verifiers hold public keys, which
cannot sign). Deleting a task already needs the owner role; now it also needs
that key, which the application never has. The other way — tombstones written
only through a path the app role cannot use, cross-checked at the next anchor
— was not taken: a superuser can use every path, and the next anchor cannot
tell a deletion made by retention from one made by hand once the rows are gone.

The signature covers ``SEALED_FIELDS`` (canonical JSON ``V1``) under the prefix
``"durable-agents/tombstone/v1\\n"``, so it cannot be replayed as an anchor's.
The chain-key seal (``key_id``, ``mac``) is still written: older verifiers
check it, and it is no longer enough alone. Tombstones written before they were
signed carry no signature; they no longer account for an anchored task (check
against anchors written after the upgrade).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import connection, transaction
from django.utils import timezone

from audit import canonical
from audit.keys import anchor_signing_key, current_chain_key, fingerprint
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
SIGNED_PREFIX = b"durable-agents/tombstone/v1\n"


def _text(fields: Mapping[str, Any]) -> bytes:
    return canonical.dumps({name: fields[name] for name in SEALED_FIELDS}, version=canonical.V1).encode()


def _mac(fields: Mapping[str, Any], secret: bytes) -> str:
    return hmac.new(secret, b"tombstone\n" + _text(fields), hashlib.sha256).hexdigest()


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
    """An unsaved tombstone for a task about to be deleted, signed with ``AUDIT_ANCHOR_KEY``.

    Raises ``ImproperlyConfigured`` when this process has no anchor signing key: a task is
    deleted only where that key is (the caller inserts the row).
    """
    fields: dict[str, Any] = {
        "task_id": task_id,
        "tenant_id": tenant_id,
        "task_type": task_type,
        "state_version": state_version,
        "audit_head": audit_head,
        "deleted_at": deleted_at or timezone.now(),
        "reason": reason,
    }
    private = anchor_signing_key()
    signature = private.sign(SIGNED_PREFIX + _text(fields))
    key = current_chain_key()
    return Tombstone(
        **fields,
        key_id=key.id,
        mac=_mac(fields, key.secret),
        signing_key=fingerprint(private.public_key()),
        signature=base64.b64encode(signature).decode(),
    )


def tombstone_problem(
    tombstone: Any, keys: Mapping[str, bytes], trusted: Mapping[str, Ed25519PublicKey]
) -> str | None:
    """Why ``tombstone`` cannot account for a deleted task, or None: ``seal_problem``, then
    ``signature_problem``."""
    return seal_problem(tombstone, keys) or signature_problem(tombstone, trusted)


def seal_problem(tombstone: Any, keys: Mapping[str, bytes]) -> str | None:
    """Why the older seal with the chain key (``keys``: ``audit.keys.chain_keys``) fails, or None."""
    secret = keys.get(tombstone.key_id)
    if secret is None:
        return f"tombstone sealed with key id {tombstone.key_id!r}, which AUDIT_HMAC_KEYS does not hold"
    fields = {name: getattr(tombstone, name) for name in SEALED_FIELDS}
    if not hmac.compare_digest(_mac(fields, secret).encode(), str(tombstone.mac).encode()):
        return "tombstone's seal does not match its contents"
    return None


def signature_problem(tombstone: Any, trusted: Mapping[str, Ed25519PublicKey]) -> str | None:
    """Why the anchor-key signature fails, or None.

    ``trusted``: the anchor public keys by fingerprint (``audit.keys.anchor_public_keys``).
    A tombstone without a signature, signed by a key not trusted here, or whose signature does
    not cover its contents could have been made by anyone holding the chain key.
    """
    if not tombstone.signature:
        return (
            "its tombstone is sealed with the chain key only (no anchor-key signature): "
            "whoever holds AUDIT_HMAC_KEYS could have written it"
        )
    public = trusted.get(tombstone.signing_key)
    if public is None:
        return f"its tombstone is signed by key {tombstone.signing_key!r}, which is not trusted here"
    fields = {name: getattr(tombstone, name) for name in SEALED_FIELDS}
    try:
        public.verify(base64.b64decode(tombstone.signature, validate=True), SIGNED_PREFIX + _text(fields))
    except (InvalidSignature, binascii.Error, ValueError):
        return "its tombstone's signature does not match its contents"
    return None
