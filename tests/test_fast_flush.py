"""The quick teardown of transactional tests (``tests/fast_flush.py``) leaves what Django's flush leaves:
every table empty, the append-only ones included, the content types and permissions untouched, and
the triggers it kept quiet on duty again afterwards."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

from audit.models import TransitionEvent
from tenancy.models import Tenant
from tests import fast_flush
from tests.conftest import make_task

pytestmark = pytest.mark.django_db(transaction=True)


def rows_left() -> dict[str, int]:
    names = [
        name
        for name in connection.introspection.django_table_names(only_existing=True)
        if name not in fast_flush.REWRITTEN
    ]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(" UNION ALL ".join(f"SELECT '{name}', count(*) FROM {quote(name)}" for name in names))
        return {name: count for name, count in cursor.fetchall() if count}


def test_the_quick_flush_empties_every_table_and_the_guards_hold_again(acme):
    make_task(acme)  # a tenant, a task and its transition events: tables that refuse a DELETE
    assert TransitionEvent.objects.exists()
    fast_flush._digests["default"] = digest = fast_flush._digest(connection)

    assert fast_flush._quick_flush(connection, "default")

    assert rows_left() == {}
    assert fast_flush._digest(connection) == digest  # content types and permissions kept as they were
    task = make_task(Tenant.objects.create(slug="acme", name="Acme"))
    with pytest.raises(DatabaseError, match="tasks_task is append-only"), transaction.atomic():
        with connection.cursor() as cursor:  # the append-only guard is back once the flush committed
            cursor.execute("DELETE FROM tasks_task WHERE id = %s", [task.id])
