"""A database outage on the A2A endpoint is a JSON-RPC error with HTTP 503 and ``Retry-After``, carrying
the request's id: never a 500 page, never a ``-32603`` with 200 that a caller would not retry."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from a2a_api.rpc import Code, RpcError, error_metadata
from config import outage
from tasks.models import Task
from tests.a2a.test_jsonrpc import a2a_settings, key_for, rpc  # noqa: F401  (a2a_settings is a fixture)
from tests.api.test_database_outage import database_at_a_closed_port, terminate_this_session
from tests.conftest import REFUND_INPUT

pytestmark = pytest.mark.django_db(transaction=True)


def _send(client: Client, key: str, rid: object):
    message = {
        "messageId": "m-outage",
        "role": "ROLE_USER",
        "parts": [{"data": {"task_type": "refund_request", "input": REFUND_INPUT}}],
    }
    return rpc(client, key, "SendMessage", {"message": message}, rid=rid)


def _assert_retry_later(response, rid: object, reason: str) -> None:
    assert response.status_code == 503
    assert response["Retry-After"] == str(outage.RETRY_AFTER)
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == rid
    assert body["error"]["code"] == Code.INTERNAL_ERROR
    assert error_metadata(body["error"]) == {"code": outage.CODE, "reason": reason}


def test_a_send_on_a_terminated_session_is_a_jsonrpc_503_and_the_retry_starts_the_task(a2a_settings, acme):  # noqa: F811
    key = key_for(acme)
    client = Client(raise_request_exception=False)
    terminate_this_session()  # the token is checked first: its query meets the dead session
    _assert_retry_later(_send(client, key, "r-1"), "r-1", "admin_shutdown")
    assert not Task.objects.exists()
    again = _send(client, key, "r-2")
    assert again.status_code == 200 and "result" in again.json()
    assert Task.objects.count() == 1


def test_no_server_answering_is_a_jsonrpc_503_not_an_internal_error(a2a_settings, acme):  # noqa: F811
    key = key_for(acme)
    client = Client(raise_request_exception=False)
    with database_at_a_closed_port():
        response = _send(client, key, 7)
    _assert_retry_later(response, 7, "connection_lost")


def test_a_read_only_server_is_a_jsonrpc_503_and_nothing_is_written(a2a_settings, acme):  # noqa: F811
    key = key_for(acme)
    client = Client(raise_request_exception=False)
    with connection.cursor() as cursor:  # what a session on a demoted primary gets
        cursor.execute("SET SESSION default_transaction_read_only = on")
    _assert_retry_later(_send(client, key, 3), 3, "read_only")
    assert not Task.objects.exists()


def test_the_outage_error_has_the_shape_of_every_other_a2a_error():
    built = RpcError(Code.INTERNAL_ERROR, outage.DETAIL, {"code": outage.CODE, "reason": "read_only"})
    assert outage.jsonrpc_error("read_only") == built.as_error()
