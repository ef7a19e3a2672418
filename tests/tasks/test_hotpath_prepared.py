"""The hot statements (``tasks.hotpath.hot_cursor``) are prepared server-side, once per connection,
where prepared statements are allowed, and never behind a transaction pooler.

Each case opens a connection of its own from the test database's settings (as a worker's would be,
with ``config.dsn.pooled`` applied for ``DATABASE_POOLER``), runs the worker's hot reads and its
claim there twice, and asks PostgreSQL which statements that session holds prepared
(``pg_prepared_statements``). Nothing is written: no candidate is runnable in an empty region.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import uuid4

import pytest
from django.db import DEFAULT_DB_ALIAS, DataError, connection, connections

from config import dsn
from tasks import hotpath, leases

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements are PostgreSQL's"),
]


@contextmanager
def worker_connection(pooler: str) -> Iterator[None]:
    """The default alias served, for the block, by a new connection made as behind ``pooler``."""
    original = connections[DEFAULT_DB_ALIAS]
    settings = copy.deepcopy(original.settings_dict)
    settings["OPTIONS"].pop("prepare_threshold", None)  # as the URL gave it, before config.settings
    dsn.pooled(settings, pooler)
    fresh = type(original)(settings, DEFAULT_DB_ALIAS)
    connections[DEFAULT_DB_ALIAS] = fresh
    try:
        yield
    finally:
        fresh.close()
        connections[DEFAULT_DB_ALIAS] = original


def hot_reads() -> None:
    for _ in range(2):
        assert hotpath.load_task(uuid4()) is None
        assert hotpath.newest_checkpoint(uuid4()).checkpoint is None
        assert leases.claim_next(worker_id="prepared-test", region="nowhere") == []


def prepared() -> list[str]:
    """The statements this session holds prepared by the client (not SQL ``PREPARE``)."""
    with connections[DEFAULT_DB_ALIAS].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements WHERE NOT from_sql")
        return [statement for (statement,) in cursor.fetchall()]


def test_hot_statements_are_prepared_once_per_connection_when_allowed(db):
    with worker_connection("none"):
        hot_reads()
        held = prepared()
        assert connections[DEFAULT_DB_ALIAS].connection.prepare_threshold is not None
    assert any(s.startswith('SELECT "tasks_task"."id"') for s in held), held  # load_task
    assert sum("WITH candidates AS MATERIALIZED" in s for s in held) == 1, held  # the claim, once
    assert sum("ORDER BY k." in s for s in held) == 1, held  # newest_checkpoint, once
    # Values are bound by the server: no value of the calls is in the statement text.
    assert not any("nowhere" in s or "prepared-test" in s for s in held), held


def test_a_new_connection_prepares_its_statements_anew(db):
    with worker_connection("none"):
        hot_reads()
        connections[DEFAULT_DB_ALIAS].close()  # as a reconnect after an outage or a failover
        hot_reads()
        held = prepared()
    assert sum("WITH candidates AS MATERIALIZED" in s for s in held) == 1, held


def test_nothing_is_prepared_behind_a_transaction_pooler(db):
    with worker_connection("transaction"):
        hot_reads()
        held = prepared()
        assert connections[DEFAULT_DB_ALIAS].connection.prepare_threshold is None
    assert held == []


def test_a_failing_hot_statement_raises_djangos_error_and_the_connection_goes_on(db):
    with worker_connection("none"):
        with pytest.raises(DataError), hotpath.hot_cursor() as cursor:
            cursor.execute("SELECT 1 / %s", [0])  # division by zero, raised from inside execute
        hot_reads()
        with hotpath.hot_cursor() as cursor:
            cursor.execute("SELECT %s::int + 1", [1])
            assert cursor.fetchone() == (2,)
            assert cursor.rowcount == 1
        held = prepared()
    assert "SELECT $1::int + 1" in held, held


def test_a_hot_statement_of_over_fifty_parameters_is_parsed_once(db, monkeypatch):
    """psycopg caches its parse of a statement (where each ``%s`` goes) only up to 50 parameters; a
    step's folded commit has more and was parsed anew at every execute. Counted at psycopg's own
    uncached parse: the second run of the same text must not reach it."""
    from psycopg import _queries

    parses: list[bytes] = []
    uncached = _queries._query2pg_nocache

    def counted(query: bytes, encoding: str) -> object:
        parses.append(query)
        return uncached(query, encoding)

    monkeypatch.setattr(_queries, "_query2pg_nocache", counted)
    values = list(range(60))
    sql = "SELECT " + " + ".join(["%s::int"] * len(values)) + " AS total"
    with worker_connection("none"):
        for _ in range(3):
            with hotpath.hot_cursor() as cursor:
                cursor.execute(sql, values)
                assert cursor.fetchone() == (sum(values),)
    assert len([query for query in parses if query == sql.encode()]) <= 1
