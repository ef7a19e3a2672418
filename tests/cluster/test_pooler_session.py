"""Behind PgBouncer in session mode: the ``options`` startup parameter; what ``DATABASE_POOLER=session`` does.

``make cluster-test`` (marker ``cluster``). A real PgBouncer (``tests.cluster.pgbouncer``) on a spare
port in front of the shared server, switched to ``pool_mode = session`` through its admin console.

On a direct connection the app asks the server to watch for a vanished client (``config.dsn.
detect_dead_peers``: ``options=-c tcp_keepalives_idle=5 -c ...``). Through PgBouncer:

- as configured by default (``ignore_startup_parameters`` without ``options``) the connection is
  refused: ``unsupported startup parameter: options``;
- with ``options`` in ``ignore_startup_parameters`` it connects, and the settings are dropped
  silently: the server session keeps the server's defaults;
- with ``DATABASE_POOLER=session`` the app sends no ``options`` through the pooler and connects as
  PgBouncer is configured by default, its own end's keepalives still on; the workers' liveness
  lock, on a direct ``DATABASE_LIVENESS_URL``, still asks the server.

And a session-level advisory lock (the workers' liveness lock, if it went through the pooler) is
released when its client process dies: PgBouncer resets the server session (``DISCARD ALL``)
before it serves anyone else, or closes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import environ
import psycopg
import pytest
from django.db import connection

from config import dsn
from tests.cluster import pgbouncer
from tests.cluster.test_pooler_settings import settings_printed

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

ENV = environ.Env()
KEEPALIVE_SETTINGS = (
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_keepalives_count",
    "tcp_user_timeout",
)
ASKED = {name: str(value) for name, value in dsn.SERVER_DEAD_PEER.items()}
LOCK_KEY = 742_025  # an advisory lock key no other test takes


def session_mode(bouncer: pgbouncer.Bouncer, *, ignore: str) -> None:
    """Switch ``bouncer`` to session pooling, ignoring the startup parameters ``ignore``; RELOAD."""
    lines = bouncer.ini.read_text().splitlines()
    lines = [line for line in lines if not line.startswith(("pool_mode", "ignore_startup_parameters"))]
    lines += ["pool_mode = session", f"ignore_startup_parameters = {ignore}"]
    bouncer.ini.write_text("\n".join(lines) + "\n")
    # Run as root, PgBouncer reads its file again as the user it dropped to.
    os.chmod(bouncer.root, 0o755)
    os.chmod(bouncer.ini, 0o644)
    bouncer.admin("RELOAD")
    config = {row["key"]: row["value"] for row in bouncer.admin("SHOW CONFIG")}
    assert (config["pool_mode"], config["ignore_startup_parameters"]) == ("session", ignore)


@pytest.fixture
def bouncer() -> Iterator[pgbouncer.Bouncer]:
    if not pgbouncer.available():
        pytest.skip("pgbouncer is not installed: scripts/ensure-cluster-packages (make cluster-test does)")
    real = connection.settings_dict
    made = pgbouncer.Bouncer((real["HOST"] or "127.0.0.1", int(real["PORT"] or 5432)))
    try:
        yield made
    finally:
        made.stop()


def app_params(url: str, pooler: str) -> dict[str, Any]:
    """The connection parameters the app builds for ``DATABASE_URL=url`` and ``DATABASE_POOLER=pooler``
    (``config/settings.py``: ``pooled``, then ``detect_dead_peers`` asking the server only with none)."""
    config = dsn.pooled(dsn.database_settings(ENV, url), pooler)
    dsn.detect_dead_peers(config, server=pooler == "none")
    return {"dbname": config["NAME"], "user": config["USER"], "host": config["HOST"],
            "port": config["PORT"], **config["OPTIONS"]}  # fmt: skip


def server_settings(conn: psycopg.Connection) -> dict[str, str]:
    return {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in KEEPALIVE_SETTINGS}  # type: ignore[index]


def test_pgbouncer_in_session_mode_refuses_the_apps_connection_as_configured_for_no_pooler(bouncer):
    session_mode(bouncer, ignore="extra_float_digits")
    params = app_params(bouncer.url(connection.settings_dict["NAME"]), "none")
    assert "-c tcp_keepalives_idle=5" in params["options"]
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(**params, connect_timeout=5).close()


def test_with_options_ignored_pgbouncer_connects_and_drops_the_servers_keepalive_settings(bouncer):
    name = connection.settings_dict["NAME"]
    session_mode(bouncer, ignore="extra_float_digits, options")
    # Straight to the server, the same parameters are applied: the check below can tell the two apart.
    direct = connection.settings_dict
    with psycopg.connect(**app_params(f"postgres://{direct['USER']}@{direct['HOST'] or '127.0.0.1'}:"
                                      f"{direct['PORT'] or 5432}/{name}", "none")) as conn:  # fmt: skip
        assert server_settings(conn) == ASKED
    with psycopg.connect(**app_params(bouncer.url(name), "none"), connect_timeout=5) as conn:
        pooled = server_settings(conn)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # Silently dropped: the server session runs with the server's defaults, none of what was asked.
    assert all(pooled[name] != ASKED[name] for name in KEEPALIVE_SETTINGS), pooled


def test_database_pooler_session_connects_through_pgbouncer_as_configured_by_default(bouncer):
    name = connection.settings_dict["NAME"]
    session_mode(bouncer, ignore="extra_float_digits")
    params = app_params(bouncer.url(name), "session")
    assert "options" not in params
    assert {k: params[k] for k in dsn.DEAD_PEER} == dsn.DEAD_PEER  # our end still gives up on a dead peer
    with psycopg.connect(**params, connect_timeout=5) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == (name,)
        # In session mode the session is this client's while it stays: SET survives the transaction.
        conn.execute("SET application_name = 'session-mode-check'")
        conn.commit()
        assert conn.execute("SHOW application_name").fetchone() == ("session-mode-check",)


def test_the_settings_ask_the_server_only_on_the_direct_liveness_connection_with_a_session_pooler():
    script = (
        "from django.conf import settings; "
        "print(repr(settings.DATABASES['default']['OPTIONS'].get('options')), "
        "'tcp_keepalives_idle=5' in settings.DATABASE_LIVENESS['OPTIONS']['options'])"
    )
    printed = settings_printed(script, DATABASE_URL="postgres://app@127.0.0.1:6432/app",
                               DATABASE_POOLER="session",
                               DATABASE_LIVENESS_URL="postgres://app@127.0.0.1:5432/app")  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.split()[-2:] == ["None", "True"]


HOLDER = """
import sys, time, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("SELECT pg_advisory_lock(%s)", (int(sys.argv[2]),))
    print("held", flush=True)
    time.sleep(600)
"""


def lock_holders(direct: psycopg.Connection) -> int:
    row = direct.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND granted", (LOCK_KEY,)
    ).fetchone()
    return int(row[0])  # type: ignore[index]


def test_a_session_lock_taken_through_a_session_pooler_goes_when_its_client_is_killed(bouncer):
    name = connection.settings_dict["NAME"]
    session_mode(bouncer, ignore="extra_float_digits")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, bouncer.url(name), str(LOCK_KEY)],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        real = connection.settings_dict
        direct_url = f"postgres://{real['USER']}@{real['HOST'] or '127.0.0.1'}:{real['PORT'] or 5432}/{name}"
        with psycopg.connect(direct_url, autocommit=True) as direct:
            assert lock_holders(direct) == 1
            os.kill(holder.pid, 9)
            holder.wait(timeout=10)
            deadline = time.monotonic() + 10
            while lock_holders(direct) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert lock_holders(direct) == 0, "the dead client's lock stayed on a pooled server session"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
