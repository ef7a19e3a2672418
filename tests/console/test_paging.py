"""The console's one keyset paginator: cursors as links carry them, and the rows past one."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from uuid import UUID

import pytest
from django.db.models import Q

from console.paging import Keyset

AGE = Keyset("after", ("state_entered_at", "id"), (datetime, UUID))
ID = UUID("0190b1c2-0000-7000-8000-000000000001")
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_a_cursor_reads_back_to_the_key_of_the_row_it_was_written_from():
    row = SimpleNamespace(state_entered_at=AT, id=ID)
    assert AGE.parse(AGE.cursor(row)) == (AT, ID)


def test_a_cursor_spells_a_time_as_microseconds_since_the_epoch():
    assert AGE.cursor(SimpleNamespace(state_entered_at=AT, id=ID)) == f"1767323045678901_{ID}"


@pytest.mark.parametrize(
    "text", [None, "", "nonsense", f"12_{ID}_x", f"x_{ID}", "1_not-a-uuid", f"{10**30}_{ID}"]
)
def test_an_absent_or_mangled_cursor_is_the_first_page(text):
    assert AGE.parse(text) is None


def test_rows_past_a_key_are_after_it_column_by_column_in_each_columns_direction():
    assert AGE.past((AT, ID)) == Q(state_entered_at__gt=AT) | Q(state_entered_at=AT, id__gt=ID)
    assert Keyset("before", ("-id",), (UUID,)).past((ID,)) == Q(id__lt=ID)
