"""Audit exports an auditor can verify offline: CSV and JSON, written as they stream.

Each event carries every field its hash covers (``audit.chain.HASHED_FIELDS``
and ``OPTIONAL_HASHED_FIELDS``) in its canonical V1 form — datetimes as ISO
8601 in UTC with microseconds, UUIDs as strings, numbers as numbers — with
``prev_hash``, ``hash`` and the ``key_id`` the hash was made with. So, outside
this system, holding the chain keys (``AUDIT_HMAC_KEYS``)::

    fields = {name: event[name] for name in HASHED_FIELDS + OPTIONAL_HASHED_FIELDS}
    assert link_hash(event["prev_hash"], fields, key_id=event["key_id"], keys=keys) == event["hash"]

for a JSON event as it is (an empty ``key_id`` is a legacy, unkeyed SHA-256
link, which needs no key). **The JSON export is the form to verify**: its
values are what the hash saw. The CSV is for reading in a spreadsheet, so no
cell is one a spreadsheet would evaluate: text starting with ``=``, ``+``,
``-``, ``@``, a tab, CR or LF (an ``=HYPERLINK(…)`` reason) — or with the guard
``'`` itself — is written with a leading ``'`` (``spreadsheet_cell``; every CSV
export, the queue's too, writes through ``stream_rows``). The guard is added on
the way out and never reaches the chain: a hash is over the raw text. To verify
a CSV anyway, undo it (``cell_text``: one leading ``'`` off each cell), read
``tenant_id``, ``state_version`` and ``attempt`` back as integers and an empty
``parent_id`` as null (``INTEGER_FIELDS``, ``NULLABLE_FIELDS``) before hashing. A task's
export also names the head and version it was read up to (the JSON's
``"task"``), so ``audit.chain.verify_events`` can check the chain is whole.

**Signed.** A JSON export ends with an Ed25519 signature by the anchor signing key over its canonical
content, and each event carries the SHA-256 ``digest`` of its canonical JSON
(``audit.export_check``, which says exactly what is signed): an auditor verifies it with the anchor
public key alone (``manage.py verify_export``, ``scripts/verify_export.py``), never with the chain's
secret; a web host that must not hold that key signs with ``AUDIT_EXPORT_KEY`` instead
(``audit.keys.export_signing_key``). A process that holds neither writes the block as
``{"unsigned": why}``, which every verifier refuses.

Pure Python over already-read events: no queries here (the caller streams pages).
"""

from __future__ import annotations

import base64
import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit import canonical, export_check
from audit.chain import GENESIS, HASHED_FIELDS, LEGACY, OPTIONAL_HASHED_FIELDS

FORMAT = export_check.FORMAT
# 2: events carry key_id; hashes are keyed (HMAC) unless key_id is empty. 3: JSON events carry their
# digest and the file ends with the anchor key's signature (audit.export_check).
FORMAT_VERSION = 3
CHAIN_FIELDS = (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)
COLUMNS = ("event_id", *CHAIN_FIELDS, "prev_hash", "hash", "key_id")
INTEGER_FIELDS = ("tenant_id", "state_version", "attempt")
NULLABLE_FIELDS = ("parent_id",)


def event_record(event: Any) -> dict[str, Any]:
    """``event`` as plain JSON values, the chain fields exactly as the hash saw them."""
    covered = {name: getattr(event, name) for name in CHAIN_FIELDS}
    # Through the chain's own encoder, so an export can never spell a value differently.
    plain = json.loads(canonical.dumps(covered, version=canonical.V1))
    return {
        "event_id": event.id,
        **plain,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
        "key_id": getattr(event, "key_id", LEGACY),
    }


def header(*, kind: str, exported_at: str, **extra: Any) -> dict[str, Any]:
    """What a JSON export says about itself before its events."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "exported_at": exported_at,
        "hash": {
            "algorithm": "hmac_sha256(AUDIT_HMAC_KEYS[key_id], prev_hash + canonical_json_v1(fields))",
            "legacy_algorithm": "sha256(prev_hash + canonical_json_v1(fields)) where key_id is empty",
            "genesis": GENESIS,
            "fields": list(HASHED_FIELDS),
            "optional_fields": list(OPTIONAL_HASHED_FIELDS),
        },
        **extra,
    }


def stream_json(
    head: dict[str, Any], events: Iterable[Any], *, signer: Ed25519PrivateKey | None = None
) -> Iterator[str]:
    """``{...head, "events": [...], "count": n, "signature": {...}}``, one event per line and chunk.

    Each event is written in canonical JSON with its ``digest``; the last chunk carries the count and
    the signature by ``signer`` (the anchor signing key) over the header, every digest and the count
    (``audit.export_check``). Without a signer the block says the export is unsigned, and why.
    """
    head = {**head, "signing": _signing(signer)}
    signed = export_check.Signed(head)
    opening = json.dumps(head, ensure_ascii=False)
    yield opening[:-1] + ', "events": [\n'
    for event in events:
        record = event_record(event)
        record[export_check.DIGEST] = export_check.event_digest(record)
        yield ("" if signed.count == 0 else ",\n") + export_check.canonical(record).decode()
        signed.add(record[export_check.DIGEST])
    block = _signature(signer, signed.hexdigest())
    yield f'\n], "count": {signed.count}, "signature": {json.dumps(block)}}}\n'


def _signing(signer: Ed25519PrivateKey | None) -> dict[str, Any]:
    """What the header says of its signature (inside what is signed)."""
    if signer is None:
        return {"key": None, "algorithm": None}
    return {
        "algorithm": "ed25519",
        "key": export_check.fingerprint(signer.public_key()),
        "verify_with": "the anchor public key: manage.py audit_anchor --public-key",
    }


def _signature(signer: Ed25519PrivateKey | None, digest: str) -> dict[str, Any]:
    if signer is None:
        return {"unsigned": "this process holds no export signing key (AUDIT_EXPORT_KEY or AUDIT_ANCHOR_KEY)"}
    return {
        "algorithm": "ed25519",
        "key": export_check.fingerprint(signer.public_key()),
        "sha256": digest,
        "value": base64.b64encode(signer.sign(export_check.message(digest))).decode(),
    }


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")
GUARD = "'"


def spreadsheet_cell(value: Any) -> Any:
    """``value`` as a CSV cell no spreadsheet evaluates: null is empty, numbers stay numbers, and
    text starting like a formula (or with ``GUARD``, so the guard can be undone) gets ``GUARD`` first."""
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith((*FORMULA_STARTS, GUARD)):
        return GUARD + value
    return value


def cell_text(cell: str) -> str:
    """The text a ``spreadsheet_cell`` was written from."""
    return cell.removeprefix(GUARD)


class _Echo:
    """A file whose ``write`` hands the line back: csv.writer without a buffer."""

    def write(self, value: str) -> str:
        return value


def stream_rows(columns: Sequence[str], rows: Iterable[Iterable[Any]]) -> Iterator[str]:
    """CSV as it streams, one line per chunk: a header row of ``columns``, then each row with every
    value a ``spreadsheet_cell``. Every CSV export writes through here, so none can skip the guard."""
    writer = csv.writer(_Echo())
    yield writer.writerow(columns)
    for row in rows:
        yield writer.writerow([spreadsheet_cell(value) for value in row])


def stream_csv(events: Iterable[Any]) -> Iterator[str]:
    """A header row of ``COLUMNS``, then one row per event (each value a ``spreadsheet_cell``)."""
    records = (event_record(event) for event in events)
    return stream_rows(COLUMNS, ([record[name] for name in COLUMNS] for record in records))
