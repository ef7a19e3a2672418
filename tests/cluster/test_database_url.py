"""A multi-host DATABASE_URL (config/dsn.py): the host list, ports and session attributes psycopg gets.

A smoke of the failover path that runs in ``make test``: the settings read from
the environment give Django, and so psycopg, every host with its own port and
``target_session_attrs=read-write``; a real connection through such a URL skips
a host nobody answers on and lands on the server that takes writes. The
failover itself (pg_auto_failover) is ``make cluster-test``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import environ
import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper

from config import dsn

ENV = environ.Env()


def test_each_host_keeps_its_own_port_and_the_writer_is_asked_for():
    url = "postgres://app:s%40cret@db1:6001,[::1]:6002,db3/payments?sslmode=prefer"
    config = dsn.database_settings(ENV, url)
    assert (config["HOST"], config["PORT"]) == ("db1,::1,db3", "6001,6002,5432")
    assert (config["NAME"], config["USER"], config["PASSWORD"]) == ("payments", "app", "s@cret")
    assert config["OPTIONS"] == {
        "sslmode": "prefer",
        "target_session_attrs": "read-write",
        "connect_timeout": dsn.CONNECT_TIMEOUT,
    }


def test_given_session_attributes_and_timeout_are_kept():
    url = "postgresql://app@db1,db2/payments?target_session_attrs=primary&connect_timeout=2"
    options = dsn.database_settings(ENV, url)["OPTIONS"]
    assert (options["target_session_attrs"], options["connect_timeout"]) == ("primary", 2)


def test_an_unknown_session_attribute_is_refused_at_start_without_the_password():
    with pytest.raises(ImproperlyConfigured, match="read_write") as refused:
        dsn.database_settings(ENV, "postgres://app:hunter2@db1,db2/app?target_session_attrs=read_write")
    assert "hunter2" not in str(refused.value)


def test_a_single_host_url_is_left_as_django_environ_reads_it():
    url = "postgres://app@db1:6001/app"
    assert dsn.database_settings(ENV, url) == ENV.db_url_config(url)


def test_the_settings_hand_psycopg_the_host_list_and_read_write():
    url = "postgres://postgres@127.0.0.1:6001,127.0.0.1:6002/app?target_session_attrs=read-write"
    shown = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; import json; "
         "d = settings.DATABASES['default']; print(json.dumps([d['HOST'], d['PORT'], d['OPTIONS']]))"],
        env={**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "1"},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    host, port, options = json.loads(shown.stdout.splitlines()[-1])
    wrapper = DatabaseWrapper({**connection.settings_dict, "HOST": host, "PORT": port, "OPTIONS": options})
    params = wrapper.get_connection_params()
    assert (params["host"], params["port"], params["target_session_attrs"]) == (
        "127.0.0.1,127.0.0.1",
        "6001,6002",
        "read-write",
    )


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.django_db
def test_a_connection_skips_a_host_that_does_not_answer_and_lands_on_the_writer():
    real = connection.settings_dict
    host = real["HOST"] or "127.0.0.1"
    url = f"postgres://{real['USER']}@127.0.0.1:{_closed_port()},{host}:{real['PORT'] or 5432}/{real['NAME']}"
    config = dsn.database_settings(ENV, url)
    wrapper = DatabaseWrapper({**real, **{k: config[k] for k in ("HOST", "PORT", "NAME", "USER")},
                               "OPTIONS": config["OPTIONS"]})  # fmt: skip
    params = wrapper.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as conn:
        assert conn.info.port == int(real["PORT"] or 5432)
        assert conn.execute("SELECT current_setting('transaction_read_only')").fetchone() == ("off",)
