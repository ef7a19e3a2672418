"""The connector contract, and what its answers mean to the ledger.

``dispatch`` either returns an ``Outcome`` the authoritative system vouched
for, raises ``Rejected`` (the system said no and did nothing), or raises
``OutcomeUnknown`` (timeout, lost answer, server error: it may or may not have
happened). ``lookup`` returns the ``Outcome`` recorded under a key, ``None``
when the system has no effect with that key, or raises ``OutcomeUnknown`` when
it cannot tell now. Nothing is ever sent again on an unknown outcome before a
``lookup`` found the key absent.

``read`` serves evidence: the ``Record`` the system holds under an id now,
``None`` when it has no such record, or ``ReadUnavailable`` when it cannot tell
now. A connector that only sends effects inherits ``Connector.read``, which
raises ``ReadNotSupported`` naming it.

``list_since`` (optional) serves recovery after a restore: every ``Held`` effect
the system recorded at or after a time, oldest first, or ``ListUnavailable`` when
it cannot tell now. A connector that cannot list inherits the default, which
raises ``ListNotSupported`` (``recover`` skips such connectors and says so).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
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


@dataclass(frozen=True)
class Record:
    """A record as the system holds it now."""

    record_id: str
    version: str
    data: dict[str, Any]


class ReadUnavailable(Exception):
    """The system did not answer a read usefully now (transport error, error status, unreadable body)."""


class ReadNotSupported(Exception):
    """This connector sends effects but cannot read records: evidence needs a connector that can."""


@dataclass(frozen=True)
class Held:
    """An effect as the system holds it: its key, when it was recorded, its status and record id."""

    key: str
    created_at: datetime
    status: str
    record_id: str


class ListUnavailable(Exception):
    """The system did not answer a listing usefully now."""


class ListNotSupported(Exception):
    """This connector cannot list the effects its system holds."""


class Connector(Protocol):
    name: str

    def dispatch(self, key: str, effect: dict[str, Any]) -> Outcome: ...

    def lookup(self, key: str) -> Outcome | None: ...

    def describe(self) -> dict[str, Any]: ...

    def read(self, record_id: str) -> Record | None:
        """The record ``record_id`` now, or ``None`` when the system has no such record.

        Raises ``ReadUnavailable`` when the system cannot tell now. This default, for
        connectors that subclass ``Connector`` and only send effects, refuses plainly.
        """
        raise ReadNotSupported(
            f"connector {self.name!r} ({type(self).__module__}.{type(self).__qualname__}) cannot read records"
        )

    def list_since(self, since: datetime) -> list[Held]:
        """Every effect the system recorded at or after ``since``, oldest first.

        Raises ``ListUnavailable`` when the system cannot tell now. This default, for
        connectors that cannot list, refuses plainly.
        """
        raise ListNotSupported(
            f"connector {self.name!r} ({type(self).__module__}.{type(self).__qualname__}) cannot list effects"
        )
