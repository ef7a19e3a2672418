"""The digest an approval is bound to: SHA-256 over canonical JSON.

Canonical form: object keys sorted, no insignificant whitespace, strings in
Unicode NFC with surrounding whitespace removed, and every number (int, float,
Decimal) written as its shortest plain decimal — so ``25``, ``25.0`` and
``Decimal("25.00")`` agree. Strings stay strings, digits and all: an order
number ``"00123"`` is not the number 123.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from decimal import Decimal
from typing import Any


def _number(value: Any) -> str:
    normalized = Decimal(str(value)).normalize()
    return format(normalized, "f") if normalized != 0 else "0"


def canonical(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value).strip()
    if isinstance(value, dict):
        return {str(key): canonical(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [canonical(item) for item in value]
    raise TypeError(f"cannot digest a {type(value).__name__}")


def digest(fields: dict[str, Any]) -> str:
    body = json.dumps(canonical(fields), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(body.encode()).hexdigest()
