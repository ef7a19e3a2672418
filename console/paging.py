"""Keyset paging for the console's own lists: one query a page, whatever the depth.

A ``Keyset`` names an order over columns that together are unique (``"-id"``;
``"state_entered_at", "id"``), the query parameter that carries the cursor, and
how the cursor spells a row's place: its key's values joined by ``_``, a
datetime as microseconds since the epoch, a UUID or an integer as itself (so
``before=<uuid>`` and ``after=<micros>_<uuid>`` links read as they always did).
``keyset_page`` reads one page past a cursor; an absent or mangled cursor is the
first page, never an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from django.db.models import Model, Q, QuerySet

M = TypeVar("M", bound=Model)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICRO = timedelta(microseconds=1)


@dataclass(frozen=True)
class Keyset:
    """``order``: the columns, ``-`` before a descending one; ``kinds``: each column's Python type."""

    param: str
    order: tuple[str, ...]
    kinds: tuple[type[datetime] | type[UUID] | type[int], ...]

    def cursor(self, row: Model) -> str:
        """Where the page after ``row`` starts, as a link carries it."""
        return "_".join(_written(getattr(row, name.lstrip("-"))) for name in self.order)

    @property
    def descending(self) -> bool:
        """Whether the order is descending; a keyset's columns all go one way (merging relies on it)."""
        directions = {name.startswith("-") for name in self.order}
        assert len(directions) == 1, "a keyset's columns go one way"
        return directions.pop()

    def sort_key(self, row: Model) -> tuple[Any, ...]:
        """``row``'s key, for sorting rows fetched apart in this order (``descending``: reversed)."""
        return tuple(getattr(row, name.lstrip("-")) for name in self.order)

    def parse(self, text: str | None) -> tuple[Any, ...] | None:
        """The key in ``text``, or None for an absent or mangled cursor (the first page)."""
        parts = (text or "").split("_")
        if len(parts) != len(self.kinds):
            return None
        try:
            return tuple(_read(kind, part) for kind, part in zip(self.kinds, parts, strict=True))
        except (ValueError, OverflowError):
            return None

    def past(self, key: tuple[Any, ...]) -> Q:
        """Rows after ``key`` in this order: (a, b) > (x, y) is a > x, or a = x and b > y."""
        found: Q | None = None
        equal: dict[str, Any] = {}
        for name, value in zip(self.order, key, strict=True):
            column = name.lstrip("-")
            beyond = Q(**equal, **{f"{column}__{'lt' if name.startswith('-') else 'gt'}": value})
            found = beyond if found is None else found | beyond
            equal[column] = value
        assert found is not None, "a keyset orders by at least one column"
        return found


@dataclass(frozen=True)
class KeysetPage(Generic[M]):
    rows: Sequence[M]
    next_cursor: str  # "" on the last page
    first: bool  # no cursor was given (or it was mangled)


def keyset_page(rows: QuerySet[M], keyset: Keyset, cursor: str | None, *, size: int) -> KeysetPage[M]:
    """The ``size`` rows of ``rows`` after ``cursor`` in ``keyset``'s order, and the next page's cursor.

    One query (``size + 1`` rows: the extra one says whether there is a next page)."""
    return merged_keyset_page([rows], keyset, cursor, size=size)


def merged_keyset_page(
    parts: Sequence[QuerySet[M]], keyset: Keyset, cursor: str | None, *, size: int
) -> KeysetPage[M]:
    """``keyset_page`` over the union of ``parts`` (disjoint querysets: one per tenant), one query each.

    Every index that orders a list leads with the tenant, so ``tenant_id IN (1, 2) ORDER BY ...`` reads
    and sorts every row of both tenants, while ``tenant_id = 1 ORDER BY ... LIMIT n`` is an index range
    that stops after ``n`` rows. Each part gives its first ``size + 1`` rows past the cursor; those
    merged in the keyset's order are exactly the first ``size + 1`` rows of the union (the key is
    unique, so nothing ties), and the page and its next cursor are what one query over the union gives.
    """
    key = keyset.parse(cursor)
    found: list[M] = []
    for rows in parts:
        if key is not None:
            rows = rows.filter(keyset.past(key))
        found.extend(rows.order_by(*keyset.order)[: size + 1])
    if len(parts) > 1:
        found.sort(key=keyset.sort_key, reverse=keyset.descending)
    more = len(found) > size
    return KeysetPage(found[:size], keyset.cursor(found[size - 1]) if more else "", key is None)


def _written(value: Any) -> str:
    if isinstance(value, datetime):
        return str((value - _EPOCH) // _MICRO)
    return str(value)


def _read(kind: type[datetime] | type[UUID] | type[int], text: str) -> Any:
    if kind is datetime:
        return _EPOCH + int(text) * _MICRO
    if kind is UUID:
        return UUID(text)
    return int(text)
