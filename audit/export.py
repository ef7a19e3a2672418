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

Pure Python over already-read events: no queries here (the caller streams pages).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from audit import canonical
from audit.chain import GENESIS, HASHED_FIELDS, LEGACY, OPTIONAL_HASHED_FIELDS

FORMAT = "durable-agents/audit-export"
FORMAT_VERSION = 2  # 2: events carry key_id; hashes are keyed (HMAC) unless key_id is empty
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


def stream_json(head: dict[str, Any], events: Iterable[Any]) -> Iterator[str]:
    """``{...head, "events": [...], "count": n}`` one event per chunk; ends with the count."""
    opening = json.dumps(head, ensure_ascii=False)
    yield opening[:-1] + ', "events": [\n'
    count = 0
    for event in events:
        yield ("" if count == 0 else ",\n") + json.dumps(event_record(event), ensure_ascii=False)
        count += 1
    yield f'\n], "count": {count}}}\n'


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
