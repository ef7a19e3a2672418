"""Behind PgBouncer in transaction mode: what ``DATABASE_POOLER`` and ``DATABASE_LIVENESS_URL`` change.

Settings only, in ``make test`` (``config/dsn.py``, ``tasks/liveness.py``):
``DATABASE_POOLER=transaction`` turns server-side cursors off and pins psycopg's
automatic prepared statements off, and refuses what would break behind the
pooler; the liveness lock alone connects where ``DATABASE_LIVENESS_URL`` says.
A real PgBouncer is ``make cluster-test`` (``test_pgbouncer.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys

import environ
import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from config import dsn
from tasks import liveness

ENV = environ.Env()
URL = "postgres://app@pgbouncer:6432/app"


def test_transaction_pooling_turns_off_server_side_cursors_and_prepared_statements():
    config = dsn.pooled(dsn.database_settings(ENV, URL + "?sslmode=prefer"), "transaction")
    assert config["DISABLE_SERVER_SIDE_CURSORS"] is True
    assert config["OPTIONS"] == {"sslmode": "prefer", "prepare_threshold": None}


def test_no_pooler_or_a_session_pooler_allows_prepared_statements_and_changes_nothing_else():
    for pooler in ("none", "session"):
        config = dsn.pooled(dsn.database_settings(ENV, URL), pooler)
        assert config.pop("OPTIONS") == {"prepare_threshold": dsn.PREPARE_THRESHOLD}
        assert config == {k: v for k, v in ENV.db_url_config(URL).items() if k != "OPTIONS"}
    given = dsn.pooled(dsn.database_settings(ENV, URL + "?prepare_threshold=0"), "none")
    assert given["OPTIONS"] == {"prepare_threshold": 0}  # the URL's own, kept
    sqlite = "sqlite:////tmp/x.sqlite3"
    assert dsn.pooled(dsn.database_settings(ENV, sqlite), "none") == ENV.db_url_config(sqlite)


def test_an_unknown_pooler_mode_is_refused_naming_the_known_ones():
    with pytest.raises(ImproperlyConfigured, match="'statement'.*none, session, transaction"):
        dsn.pooled(dsn.database_settings(ENV, URL), "statement")


def test_prepared_statements_asked_for_in_the_url_are_refused_behind_a_transaction_pooler():
    with pytest.raises(ImproperlyConfigured, match="prepare_threshold"):
        dsn.pooled(dsn.database_settings(ENV, URL + "?prepare_threshold=5"), "transaction")


def test_a_pooler_in_front_of_sqlite_is_refused():
    with pytest.raises(ImproperlyConfigured, match="must name PostgreSQL"):
        dsn.pooled(dsn.database_settings(ENV, "sqlite:////tmp/x.sqlite3"), "transaction")


def test_the_liveness_url_gives_connection_fields_hosts_and_ports_included():
    direct = dsn.liveness_settings(ENV, "postgres://app:s%40cret@db1:5432,db2:5433/app_live")
    assert direct == {
        "NAME": "app_live",
        "USER": "app",
        "PASSWORD": "s@cret",
        "HOST": "db1,db2",
        "PORT": "5432,5433",
        "OPTIONS": {"target_session_attrs": "read-write", "connect_timeout": dsn.CONNECT_TIMEOUT},
    }
    assert dsn.liveness_settings(ENV, "") is None


def test_a_liveness_url_that_is_not_postgresql_is_refused_without_its_password():
    with pytest.raises(ImproperlyConfigured, match="DATABASE_LIVENESS_URL.*not a PostgreSQL") as refused:
        dsn.liveness_settings(ENV, "mysql://app:hunter2@db1/app")
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ImproperlyConfigured, match="^DATABASE_LIVENESS_URL: target_session_attrs"):
        dsn.liveness_settings(ENV, "postgres://app@db1,db2/app?target_session_attrs=writer")


def test_liveness_behind_a_transaction_pooler_needs_a_direct_url_or_liveness_off():
    with pytest.raises(ImproperlyConfigured, match="DATABASE_LIVENESS_URL.*WORKER_LIVENESS=0"):
        dsn.require_direct_liveness("transaction", True, None)
    dsn.require_direct_liveness("transaction", False, None)  # leases lapse by TTL only: allowed
    dsn.require_direct_liveness("transaction", True, {"HOST": "db1"})
    dsn.require_direct_liveness("none", True, None)


def settings_printed(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` run in a fresh process whose settings load from ``env`` (and no other DATABASE_*)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DATABASE_")}
    return subprocess.run(
        [sys.executable, "-c", script],
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "1", **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _settings_with(**env: str) -> subprocess.CompletedProcess[str]:
    script = (
        "from django.conf import settings; d = settings.DATABASES['default']; "
        "print(d.get('DISABLE_SERVER_SIDE_CURSORS', False), "
        "d.get('OPTIONS', {}).get('prepare_threshold', 'unset'), "
        "(settings.DATABASE_LIVENESS or {}).get('PORT'))"
    )
    return settings_printed(script, **env)


def test_the_settings_read_the_pooler_and_the_liveness_url_from_the_environment():
    pooled = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:6432/app", DATABASE_POOLER="transaction",
                            DATABASE_LIVENESS_URL="postgres://app@127.0.0.1:5432/app")  # fmt: skip
    assert pooled.returncode == 0, pooled.stderr
    assert pooled.stdout.split()[-3:] == ["True", "None", "5432"]
    direct = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:5432/app")
    assert direct.stdout.split()[-3:] == ["False", str(dsn.PREPARE_THRESHOLD), "None"]


def test_the_settings_refuse_to_start_with_the_liveness_lock_behind_a_transaction_pooler():
    refused = _settings_with(DATABASE_URL="postgres://app@127.0.0.1:6432/app", DATABASE_POOLER="transaction")
    assert refused.returncode != 0
    assert "set DATABASE_LIVENESS_URL to a direct PostgreSQL URL" in refused.stderr


@pytest.mark.django_db(transaction=True)
def test_the_liveness_lock_connects_where_the_liveness_url_says_and_nowhere_else():
    real = connection.settings_dict
    # The direct URL is this server by another spelling (localhost), with a timeout of its own.
    direct = dsn.liveness_settings(
        ENV, f"postgres://{real['USER']}@localhost:{real['PORT'] or 5432}/{real['NAME']}?connect_timeout=3"
    )
    with override_settings(DATABASE_LIVENESS=direct):
        params = liveness._connect_params()
        assert (params["host"], params["dbname"], params["connect_timeout"]) == ("localhost", real["NAME"], 3)
        assert params["application_name"] == liveness.APPLICATION_NAME
        with psycopg.connect(**params) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == (real["NAME"],)
    assert liveness._connect_params()["host"] == (real["HOST"] or "127.0.0.1")
