"""The digest an approval is bound to: SHA-256 over canonical JSON, format ``audit.canonical.V2``.

V2 (documented in ``audit.canonical``): object keys sorted, no insignificant
whitespace, strings and keys in Unicode NFC (nothing else changed: the binding
covers the exact text that will be sent), and every number (int, float,
Decimal) written as its shortest plain decimal JSON number — so ``25``,
``25.0`` and ``Decimal("25.00")`` agree, while ``25`` and ``"25"`` (a number
and a string) do not. Every stored approval digest was written in V2.
"""

from __future__ import annotations

from typing import Any

from audit import canonical as canonical_json

FORMAT = canonical_json.V2


def canonical(value: Any) -> str:
    """The canonical JSON text of ``value`` (format V2)."""
    return canonical_json.dumps(value, version=FORMAT)


def digest(fields: dict[str, Any]) -> str:
    return canonical_json.digest(fields, version=FORMAT)
