"""A vanished peer is given up on in seconds (``config.dsn.detect_dead_peers``): both ends are told.

Runs in ``make test`` (no marker). What it ends in a real partition — the cut
worker's liveness session gone from the server within ``DEAD_PEER_SECONDS`` — is
``tests/cluster/test_partition.py`` (``make partition-test``).
"""

from __future__ import annotations

import environ
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from config import dsn
from tasks import liveness

ENV = environ.Env()
URL = "postgres://app@db1:5432/app"


def test_our_end_gets_keepalives_and_a_user_timeout_and_the_server_is_asked_the_same():
    config = dsn.detect_dead_peers(dsn.database_settings(ENV, URL), server=True)
    options = config["OPTIONS"]
    assert {name: options[name] for name in dsn.DEAD_PEER} == dsn.DEAD_PEER
    assert options["options"] == " ".join(f"-c {k}={v}" for k, v in dsn.SERVER_DEAD_PEER.items())


def test_behind_a_pooler_the_server_is_not_asked_through_it():
    config = dsn.detect_dead_peers(dsn.database_settings(ENV, URL), server=False)
    assert "options" not in config["OPTIONS"]
    assert config["OPTIONS"]["tcp_user_timeout"] == dsn.DEAD_PEER["tcp_user_timeout"]


def test_values_and_server_options_the_url_gives_are_kept():
    url = URL + "?keepalives_idle=30&options=-c%20statement_timeout%3D5000%20-c%20tcp_user_timeout%3D1000"
    options = dsn.detect_dead_peers(dsn.database_settings(ENV, url), server=True)["OPTIONS"]
    assert options["keepalives_idle"] == 30
    assert "-c statement_timeout=5000 -c tcp_user_timeout=1000" in options["options"]
    assert options["options"].count("tcp_user_timeout") == 1
    assert "-c tcp_keepalives_idle=5" in options["options"]


def test_sqlite_is_left_alone():
    config = dsn.database_settings(ENV, "sqlite:////tmp/x.sqlite3")
    assert dsn.detect_dead_peers(dict(config), server=True) == config


@pytest.mark.django_db
def test_a_real_session_of_the_settings_runs_with_the_servers_keepalives_on():
    if settings.DATABASE_POOLER != "none" or (connection.settings_dict["HOST"] or "").startswith("/"):
        pytest.skip("the server is asked only on a direct TCP connection")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_user_timeout')")
        assert cursor.fetchone() == ("5", "15000")
    # The liveness lock's own session too (tasks.liveness connects with the same parameters).
    with psycopg.connect(**liveness._connect_params()) as conn:
        assert conn.execute("SHOW tcp_keepalives_count").fetchone() == ("3",)
        assert conn.info.get_parameters().get("application_name") == liveness.APPLICATION_NAME
