"""The connector contract, and what its answers mean to the ledger.

``dispatch`` either returns an ``Outcome`` the authoritative system vouched
for, raises ``Rejected`` (the system said no and did nothing), or raises
``OutcomeUnknown`` (timeout, lost answer, server error: it may or may not have
happened). ``lookup`` returns the ``Outcome`` recorded under a key, ``None``
when the system has no effect with that key, or raises ``OutcomeUnknown`` when
it cannot tell now. Nothing is ever sent again on an unknown outcome before a
``lookup`` found the key absent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Outcome:
    status: str  # "succeeded" | "failed", as the authoritative system recorded it
    external_ref: str = ""
    record_version: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    # True when the system answered a repeated key with its first result: a duplicate it suppressed.
    replayed: bool = False


class Rejected(Exception):
    """The system refused the effect and did nothing."""


class OutcomeUnknown(Exception):
    """The system may or may not have performed the effect."""


class Connector(Protocol):
    name: str

    def dispatch(self, key: str, effect: dict[str, Any]) -> Outcome: ...

    def lookup(self, key: str) -> Outcome | None: ...

    def describe(self) -> dict[str, Any]: ...
