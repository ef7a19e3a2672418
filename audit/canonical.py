"""Canonical JSON and its SHA-256: the one encoder behind every stored hash, key and body.

Every hash the system stores is SHA-256 (hex) over the UTF-8 bytes of a
canonical JSON text, and every call site names the format it writes. A format
never changes once a value has been stored under it: a new rule is a new
version, and old values keep being checked with the version that made them.

``V1`` — audit chain hashes (``audit.chain``), action effect digests and the
idempotency keys built from them (``tasks.transitions.ActionIntent``):

- ``json.dumps`` with keys sorted (by code point) and separators ``,`` and ``:``
  (no whitespace anywhere);
- text as is, written as UTF-8 (``ensure_ascii=False``); no Unicode
  normalization, so NFC and NFD spellings differ;
- numbers as Python's ``json`` writes them: ``25`` and ``25.0`` differ, and
  so do ``25`` and ``"25"``; ``NaN``/``Infinity`` written as such;
- datetimes, at any depth, as ISO 8601 in UTC with microseconds
  (``2026-01-01T12:00:00.000000+00:00``); a naive datetime is read as the
  machine's local time (``datetime.astimezone``), as the chain always did;
- UUIDs as their canonical string; tuples as lists;
- keys are strings (``json`` writes int/float/bool/None keys as strings, and
  cannot sort them among string keys: ``TypeError``);
- anything else (``Decimal``, dates, sets, bytes, other objects) raises
  ``TypeError``.

``V1_ASCII`` — checkpoint bodies (``tasks.checkpoints.encode``), task request
digests and input payload digests (``tasks.services``): every rule of ``V1``,
except that text is written as ASCII with ``\\uXXXX`` escapes
(``ensure_ascii=True``, ``json``'s default, which those sites always used).
Only text without DEL (U+007F) and non-ASCII characters comes out the same in
both (``V1_ASCII`` escapes DEL as ``\u007f``, ``V1`` does not); any other
text differs, so neither can replace the other without changing stored values.

``V2`` — approval bindings (``approvals.digest``): what an approver saw must
match what is sent, whatever spelling the facts arrive in:

- keys sorted by code point, no whitespace, text as UTF-8;
- strings and keys in Unicode NFC (nothing else changed);
- every number (int, float, ``Decimal``) as its shortest plain decimal:
  ``25``, ``25.0`` and ``Decimal("25.00")`` are all ``25``; ``-0.0`` is ``0``;
  no exponent (``1E+3`` is ``1000``); non-finite numbers raise ``TypeError``;
- a number and a string stay apart: ``25`` and ``"25"`` differ;
- ``None``, booleans, lists and tuples as JSON; anything else, datetimes and
  UUIDs included, raises ``TypeError``.

Pure Python: imports nothing from the project or Django, so benchmarks and
exports hash outside Django.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final
from uuid import UUID

V1: Final = "v1"
V1_ASCII: Final = "v1-ascii"
V2: Final = "v2"
VERSIONS: Final = (V1, V1_ASCII, V2)


def _v1_value(value: Any) -> Any:
    """``json.dumps``'s ``default`` hook for V1: only datetimes and UUIDs have a form."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, UUID):
        return str(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _v1(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_v1_value)


def _v1_ascii(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_v1_value)


def _v2_text(value: str) -> str:
    return json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False)


def _v2_number(value: int | float | Decimal) -> str:
    number = Decimal(str(value))
    if not number.is_finite():
        raise TypeError(f"cannot digest the number {value!r}")
    return "0" if number == 0 else format(number.normalize(), "f")


def _v2(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return _v2_number(value)
    if isinstance(value, str):
        return _v2_text(value)
    if isinstance(value, dict):
        items = sorted((unicodedata.normalize("NFC", str(key)), item) for key, item in value.items())
        return "{" + ",".join(f"{_v2_text(key)}:{_v2(item)}" for key, item in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_v2(item) for item in value) + "]"
    raise TypeError(f"cannot digest a {type(value).__name__}")


_ENCODERS: Final[dict[str, Callable[[Any], str]]] = {V1: _v1, V1_ASCII: _v1_ascii, V2: _v2}


def dumps(value: Any, *, version: str) -> str:
    """The canonical JSON text of ``value`` in format ``version`` (``V1``, ``V1_ASCII`` or ``V2``).

    Raises ``TypeError`` for a value the format has no form for, ``ValueError``
    for an unknown version.
    """
    try:
        encode = _ENCODERS[version]
    except KeyError:
        raise ValueError(
            f"unknown canonical JSON version {version!r}; known: {', '.join(VERSIONS)}"
        ) from None
    return encode(value)


def digest_text(text: str) -> str:
    """SHA-256 (hex) of ``text``'s UTF-8 bytes: for text already canonical (a stored body, a chain link)."""
    return hashlib.sha256(text.encode()).hexdigest()


def digest(value: Any, *, version: str) -> str:
    """SHA-256 (hex) of the canonical JSON of ``value`` in format ``version``."""
    return digest_text(dumps(value, version=version))
