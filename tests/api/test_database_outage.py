"""A request that meets a database outage answers 503 with Retry-After, never a 500 (config/outage.py).

The outage is real, for the one request: the session the request will use is
terminated by the server first (what a failover does to every session), or the
connection settings point at a port nobody listens on (no primary yet), or the
session is read-only (an old primary, demoted). The next request, with the
database back, is served as usual.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

import psycopg
import pytest
from django.db import IntegrityError, OperationalError, connection
from django.test import Client

from config import outage
from tasks.models import Task
from tests.api.conftest import TASKS, create_body, no_raise, post_json
from tests.conftest import api_client_for

pytestmark = pytest.mark.django_db(transaction=True)


def _assert_503(response) -> None:
    assert response.status_code == 503
    assert response["Retry-After"] == str(outage.RETRY_AFTER)
    assert "no-store" in response["Cache-Control"]


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def database_at_a_closed_port():
    """This thread's connection settings name a port nobody listens on, for the block."""
    saved = (connection.settings_dict["HOST"], connection.settings_dict["PORT"])
    connection.close()
    connection.settings_dict["HOST"], connection.settings_dict["PORT"] = "127.0.0.1", _closed_port()
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["HOST"], connection.settings_dict["PORT"] = saved


def terminate_this_session() -> None:
    """The server ends the session this thread holds, as a failover does; Django does not know yet."""
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])


def test_a_create_on_a_terminated_session_answers_503_and_the_retry_creates_the_task(operator):
    client = no_raise(api_client_for(operator))
    terminate_this_session()
    response = post_json(client, TASKS, create_body())
    _assert_503(response)
    assert response.json()["code"] == "database_unavailable"
    # The retry, the database back, is served; nothing was half written by the first.
    assert post_json(client, TASKS, create_body()).status_code == 201
    assert Task.objects.count() == 1


def test_a_list_while_no_server_answers_is_a_503_json_answer(operator):
    client = no_raise(api_client_for(operator))
    with database_at_a_closed_port():
        response = client.get(TASKS)
    _assert_503(response)
    assert response.json()["reason"] == "connection_lost"
    assert client.get(TASKS).status_code == 200


def test_a_console_page_whose_session_cannot_be_loaded_answers_503(operator):
    # The session and the user are loaded by middleware, before any view: handler500's path.
    client = Client(raise_request_exception=False)
    client.force_login(operator)
    with database_at_a_closed_port():
        response = client.get("/console/", HTTP_ACCEPT="text/html")
    _assert_503(response)
    assert b"Service unavailable" in response.content


def test_a_write_to_a_read_only_server_answers_503_and_writes_nothing(operator):
    client = no_raise(api_client_for(operator))
    with connection.cursor() as cursor:  # what a session on a demoted primary gets
        cursor.execute("SET SESSION default_transaction_read_only = on")
    response = post_json(client, TASKS, create_body())
    _assert_503(response)
    assert response.json()["reason"] == "read_only"
    assert not Task.objects.exists()  # a fresh session: the answer closed the read-only one


def test_only_outages_are_503s():
    assert outage.outage_reason(OperationalError("server closed the connection unexpectedly"))
    assert outage.outage_reason(IntegrityError("duplicate key")) is None
    assert outage.outage_reason(ValueError("a bug")) is None


def test_any_other_error_still_gets_the_500_page(rf):
    try:
        raise ValueError("a bug")
    except ValueError:
        response = outage.server_error(rf.get("/console/"))
    assert response.status_code == 500 and "Retry-After" not in response
