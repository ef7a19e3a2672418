"""The replica middleware (``config/db_router.py``) in ``make test``: a ``replica`` alias added for the
test, on a server that is no standby or on a port nobody answers on.

Each page must answer 200 from the primary and say why (``X-Read-From``): a
primary named as the replica is not read (``pg_last_wal_replay_lsn()`` is NULL
there), an unreachable one is not waited for, and one that fails mid-page (the
replica answering the page's first question, then gone: the probe's answer
injected, the failure real) has the page read again on the primary. A POST
leaves the primary's WAL position in the session and the cache. The real
standby is ``test_replica_reads.py`` (``make cluster-test``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from django.core.cache import cache
from django.db import connection, connections

from config import db_router
from config.db_router import REPLICA, ReplicaState, lsn
from tests.chaos.standby import free_port
from tests.conftest import make_task

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.filterwarnings("ignore:Overriding setting DATABASES"),  # the alias added below
]


@pytest.fixture
def replica(settings) -> Iterator[Callable[..., None]]:
    """``replica(**fields)``: a ``replica`` alias like ``default`` but for ``fields``, and the router on."""
    settings.DATABASE_ROUTERS = ["config.db_router.ReplicaRouter"]
    db_router._down_until = 0.0

    def add(**fields: object) -> None:
        config = {**connection.settings_dict, **fields}
        settings.DATABASES = {**settings.DATABASES, REPLICA: config}
        # A connection made for the test (Django lets a test use one it did not declare).
        setattr(connections._connections, REPLICA, type(connections["default"])(config, alias=REPLICA))

    yield add
    made = getattr(connections._connections, REPLICA, None)
    if made is not None:
        made.close()
        delattr(connections._connections, REPLICA)
    db_router._down_until = 0.0


@pytest.fixture
def signed_in(client, operator):
    client.force_login(operator)
    return client


def test_without_a_replica_pages_say_nothing(signed_in):
    response = signed_in.get("/console/")
    assert response.status_code == 200
    assert "X-Read-From" not in response


def test_a_primary_named_as_the_replica_is_not_read(replica, signed_in):
    replica()  # the test database itself: a primary, whose pg_last_wal_replay_lsn() is NULL
    for path in ("/console/", "/console/audit/", "/console/dashboard/"):
        response = signed_in.get(path)
        assert (response.status_code, response["X-Read-From"]) == (200, "primary; replica is not a standby")


def test_an_unreachable_replica_is_not_waited_for(replica, signed_in):
    replica(PORT=free_port())  # nobody listens
    for _ in range(2):  # the second page does not even try: the process leaves it alone a while
        response = signed_in.get("/console/")
        assert (response.status_code, response["X-Read-From"]) == (200, "primary; replica unavailable")
    assert db_router.probe() is None


def test_a_replica_failing_mid_page_has_the_page_read_again_on_the_primary(
    replica, signed_in, acme, monkeypatch
):
    task = make_task(acme, objective="Refund order A-1 (mid-page)")
    replica(PORT=free_port())
    # The replica answered the page's question, caught up, then is gone for its first query.
    monkeypatch.setattr(db_router, "probe", lambda: ReplicaState(replayed=lsn("FF/0"), lag=0.0))
    response = signed_in.get(f"/console/tasks/{task.id}/")
    assert (response.status_code, response["X-Read-From"]) == (200, "primary; replica failed")
    assert "Refund order A-1 (mid-page)" in response.content.decode()
    monkeypatch.undo()
    assert db_router.probe() is None  # left alone a while, as if found unreachable


def test_a_post_leaves_the_primarys_position_for_the_callers_next_pages(replica, signed_in, operator):
    replica()
    before = lsn(connection.cursor().execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
    assert signed_in.post("/console/theme/", {"theme": "dark", "next": "/console/"}).status_code == 302
    remembered = lsn(signed_in.session[db_router.SESSION_KEY])
    assert remembered >= before
    assert lsn(cache.get(f"{db_router.CACHE_PREFIX}{operator.pk}")) == remembered
    # A replica that has not replayed it is not read for this caller.
    state = ReplicaState(replayed=remembered - 1, lag=0.0)
    assert db_router.choose(state, remembered, 5) == (False, "replica behind your write")
