"""The digest an approval is bound to: SHA-256 over canonical JSON.

Canonical form: object keys sorted, no insignificant whitespace, strings and
keys in Unicode NFC (nothing else changed: the binding covers the exact text
that will be sent), and every number (int, float, Decimal) written as its
shortest plain decimal JSON number — so ``25``, ``25.0`` and
``Decimal("25.00")`` agree, while ``25`` and ``"25"`` (a number and a
string) do not.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from decimal import Decimal
from typing import Any


def _text(value: str) -> str:
    return json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False)


def _number(value: int | float | Decimal) -> str:
    number = Decimal(str(value))
    if not number.is_finite():
        raise TypeError(f"cannot digest the number {value!r}")
    return "0" if number == 0 else format(number.normalize(), "f")


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, dict):
        items = sorted((unicodedata.normalize("NFC", str(key)), item) for key, item in value.items())
        return "{" + ",".join(f"{_text(key)}:{canonical(item)}" for key, item in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(canonical(item) for item in value) + "]"
    raise TypeError(f"cannot digest a {type(value).__name__}")


def digest(fields: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(fields).encode()).hexdigest()
