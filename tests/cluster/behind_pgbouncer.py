"""A pytest plugin for a test run behind PgBouncer (``make pgbouncer-test``; ``tests.cluster.pgbouncer``).

The run's ``DATABASE_URL`` goes through the pooler and ``DATABASE_LIVENESS_URL``
straight to the server, both naming the database the run was given. pytest-django
then renames the database to its test database (``test_<name>``, per xdist
worker): this plugin points the liveness lock there too, in this process and in
every worker process a test starts (they inherit ``os.environ``). At the end it
closes PgBouncer's sessions on the test database (``KILL``, then ``RESUME``), so
pytest-django can drop it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.db import connections

from tests.cluster import pgbouncer


@pytest.fixture(scope="session", autouse=True)
def _liveness_on_the_test_database(django_db_setup) -> Iterator[None]:
    name = connections["default"].settings_dict["NAME"]
    if settings.DATABASE_LIVENESS is not None:
        settings.DATABASE_LIVENESS = {**settings.DATABASE_LIVENESS, "NAME": name}
    if os.environ.get("DATABASE_LIVENESS_URL"):
        url = urlsplit(os.environ["DATABASE_LIVENESS_URL"])
        os.environ["DATABASE_LIVENESS_URL"] = url._replace(path=f"/{name}").geturl()
    yield
    port = os.environ.get("PGBOUNCER_PORT")
    if port:
        connections["default"].close()
        pgbouncer.admin(int(port), f'KILL "{name}"')
        pgbouncer.admin(int(port), f'RESUME "{name}"')
