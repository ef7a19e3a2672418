"""Empty the tables after a transactional test the quick way, to the same state Django's flush leaves.

Django ends a ``transaction=True`` test with ``manage.py flush``: one ``TRUNCATE`` of every model
table, then the ``post_migrate`` signal, which writes the content types and permissions again. On
this project that is about 0.5 s a test (a hundred tables truncated, file by file, and a few hundred
rows written back), and a good part of the suite's time.

What it leaves is known: every table empty but ``django_content_type`` and ``auth_permission``,
which hold what ``post_migrate`` writes. So after the first flush of a database (Django's own, as
always) their contents are kept as a digest, and later teardowns empty only the tables that hold
rows, leaving those two alone while their digest is unchanged. A test that changed them (or a
database not PostgreSQL, a test case with ``available_apps`` or serialized rollback) gets Django's
flush, and the digest is taken again.

The tables that hold rows are emptied with ``DELETE``, not ``TRUNCATE``: a ``TRUNCATE`` gives every
table and index it empties new files, and its ``CASCADE`` reaches every table that references one of
them (nearly all reference the tenant), so it cost 0.3-2 s a test; the few rows a test leaves are
deleted in milliseconds. ``session_replication_role = replica`` (for that transaction only; the test
role is a superuser) keeps every trigger quiet meanwhile, the foreign-key checks and the append-only
guards (which refuse a ``DELETE`` but let the owner ``TRUNCATE``): the tables end as empty as a
``TRUNCATE`` leaves them, the order of the deletes does not matter, and nothing else is written. If
that is refused (a role that may not set it), Django's flush runs instead.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

# What ``post_migrate`` writes back after a flush: kept, not truncated and written again.
REWRITTEN = ("django_content_type", "auth_permission")

_django_teardown = TransactionTestCase._fixture_teardown
_digests: dict[str, str] = {}  # database alias -> digest of REWRITTEN after its last Django flush


def install() -> None:
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[method-assign]


def _fixture_teardown(self: TransactionTestCase) -> None:
    names = self._databases_names(include_mirrors=False)  # type: ignore[attr-defined]
    plain = self.available_apps is None and not self.serialized_rollback
    if plain and all(_quick_flush(connections[name], name) for name in names):
        return
    _django_teardown(self)
    for name in names:
        if connections[name].vendor == "postgresql":
            _digests[name] = _digest(connections[name])


def _quick_flush(connection: Any, alias: str) -> bool:
    """Empty the tables of ``connection`` that hold rows; False (nothing done) when Django's flush
    must run instead."""
    if connection.vendor != "postgresql" or alias not in _digests or _digest(connection) != _digests[alias]:
        return False
    tables = [
        t for t in connection.introspection.django_table_names(only_existing=True) if t not in REWRITTEN
    ]
    quote = connection.ops.quote_name
    probes = " UNION ALL ".join(
        f"SELECT {index} WHERE EXISTS (SELECT 1 FROM {quote(table)})" for index, table in enumerate(tables)
    )
    try:
        with transaction.atomic(using=alias), connection.cursor() as cursor:
            cursor.execute(probes)
            holding = [tables[index] for (index,) in cursor.fetchall()]
            if holding:
                deletes = "; ".join(f"DELETE FROM {quote(table)}" for table in holding)
                cursor.execute(f"SET LOCAL session_replication_role = replica; {deletes}")
    except DatabaseError:
        return False
    return True


def _digest(connection: Any) -> str:
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        rows = "md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), ''))"
        each = [f"SELECT (SELECT {rows} FROM {quote(name)} t)" for name in REWRITTEN]
        cursor.execute(" UNION ALL ".join(each))
        return ",".join(row[0] for row in cursor.fetchall())
