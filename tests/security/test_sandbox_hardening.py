"""The sandbox, when on, answers only its token's bearers and checks every fault control (issue 12, item 8).

Reproduced before: with the sandbox on, anyone who reached ``/sandbox/`` could queue faults and
"pay"; a latency fault had no cap (``{"ms": 10**9}`` held a server thread for days) and
``"ms": "abc"`` was a 500.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from demo.sandbox.models import Effect, Fault, Record
from demo.sandbox.views import MAX_LATENCY_MS
from tests.security.test_defaults import manage, production_env

pytestmark = pytest.mark.django_db

CALLS = [
    ("post", "/sandbox/payments/effects/"),
    ("get", "/sandbox/payments/effects/k-1"),
    ("get", "/sandbox/orders/records/A-1"),
    ("put", "/sandbox/orders/records/A-1"),
    ("post", "/sandbox/faults/"),
    ("delete", "/sandbox/faults/"),
]


@pytest.fixture
def bearer(settings) -> Client:
    return Client(headers={"Authorization": f"Bearer {settings.SANDBOX_TOKEN}"})


def call(client: Client, method: str, path: str, body=None, **headers):
    if method == "get":
        return client.get(path, **headers)
    return getattr(client, method)(
        path, json.dumps({} if body is None else body), content_type="application/json", **headers
    )


@pytest.mark.parametrize(("method", "path"), CALLS)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-token", "Token test-only-sandbox-token", "Bearer"]
)
def test_every_sandbox_endpoint_answers_401_without_its_token(method, path, authorization):
    headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
    response = call(Client(), method, path, {"system": "payments", "kind": "error"}, **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert "SANDBOX_TOKEN" in response.json()["detail"]
    assert not Fault.objects.exists() and not Record.objects.exists() and not Effect.objects.exists()


def test_with_its_token_the_sandbox_answers(bearer):
    created = call(bearer, "post", "/sandbox/payments/effects/", {"amount": "1"}, HTTP_IDEMPOTENCY_KEY="k-1")
    assert created.status_code == 201
    assert call(bearer, "get", "/sandbox/payments/effects/k-1").status_code == 200


def test_a_person_signed_in_to_the_console_may_read_a_record_and_nothing_else(client, operator):
    """The evidence links on approval pages open records in the approver's browser, which has no token."""
    Record.objects.create(system="orders", record_id="A-1", data={"status": "delivered"})
    client.force_login(operator)
    assert call(client, "get", "/sandbox/orders/records/A-1").status_code == 200
    assert call(client, "put", "/sandbox/orders/records/A-1", {"status": "lost"}).status_code == 401
    assert call(client, "get", "/sandbox/payments/effects/k-1").status_code == 401
    assert call(client, "post", "/sandbox/faults/", {"system": "orders", "kind": "error"}).status_code == 401


def test_a_sandbox_without_a_token_configured_answers_nobody(settings):
    settings.SANDBOX_TOKEN = ""
    response = call(Client(headers={"Authorization": "Bearer "}), "get", "/sandbox/orders/records/A-1")
    assert response.status_code == 401


BAD_FAULTS = {
    "ms-not-a-number": ({"kind": "latency", "params": {"ms": "abc"}}, "latency ms"),
    "ms-negative": ({"kind": "latency", "params": {"ms": -5}}, "latency ms"),
    "ms-huge": ({"kind": "latency", "params": {"ms": 10**9}}, "latency ms"),
    "ms-just-over-the-cap": ({"kind": "latency", "params": {"ms": MAX_LATENCY_MS + 1}}, "latency ms"),
    "ms-a-boolean": ({"kind": "latency", "params": {"ms": True}}, "latency ms"),
    "ms-a-float": ({"kind": "latency", "params": {"ms": 1.5}}, "latency ms"),
    "ms-on-another-kind": ({"kind": "error", "params": {"ms": 5}}, "latency faults only"),
    "seconds-huge": ({"kind": "timeout", "params": {"seconds": 86400}}, "params.seconds"),
    "seconds-text": ({"kind": "timeout", "params": {"seconds": "30"}}, "params.seconds"),
    "unknown-kind": ({"kind": "explode"}, "kind must be one of"),
    "unknown-param": ({"kind": "error", "params": {"msec": 5}}, "unknown params ['msec']"),
    "unknown-field": ({"kind": "error", "repeat": 3}, "unknown fields ['repeat']"),
    "key-not-text": ({"kind": "error", "params": {"key": 7}}, "params.key"),
    "standing-not-boolean": ({"kind": "error", "params": {"standing": "yes"}}, "params.standing"),
    "remaining-huge": ({"kind": "error", "remaining": 10**12}, "remaining"),
    "params-not-an-object": ({"kind": "error", "params": "ms=5"}, "params must be a JSON object"),
}


@pytest.mark.parametrize(("fault", "says"), BAD_FAULTS.values(), ids=BAD_FAULTS.keys())
def test_a_bad_fault_control_is_a_400_saying_what_is_wrong(bearer, fault, says):
    response = call(bearer, "post", "/sandbox/faults/", {"system": "payments", **fault})
    assert response.status_code == 400
    assert says in response.json()["detail"]
    assert not Fault.objects.exists()


def test_the_longest_latency_allowed_is_queued(bearer):
    fault = {"system": "orders", "operation": "read", "kind": "latency", "params": {"ms": MAX_LATENCY_MS}}
    assert call(bearer, "post", "/sandbox/faults/", fault).status_code == 201
    assert Fault.objects.get().params == {"ms": MAX_LATENCY_MS}


@pytest.mark.parametrize(
    "header", ["latency=abc", "latency=-1", f"latency={MAX_LATENCY_MS + 1}", "explode", "error=5"]
)
def test_a_bad_fault_header_is_a_400_and_does_nothing(bearer, header):
    response = call(
        bearer,
        "post",
        "/sandbox/payments/effects/",
        {},
        HTTP_IDEMPOTENCY_KEY="k",
        HTTP_X_SANDBOX_FAULT=header,
    )
    assert response.status_code == 400
    assert "X-Sandbox-Fault" in response.json()["detail"] or "latency ms" in response.json()["detail"]
    assert not Effect.objects.exists()
    assert call(bearer, "get", "/sandbox/orders/records/A-1", HTTP_X_SANDBOX_FAULT=header).status_code == 400


def test_a_latency_fault_still_sleeps_no_longer_than_the_cap(bearer, monkeypatch):
    """A row written around the API (the admin, SQL) is capped when it is used."""
    slept = []
    monkeypatch.setattr("demo.sandbox.views.time.sleep", slept.append)
    Fault.objects.create(system="orders", operation="read", kind="latency", params={"ms": 10**9})
    Record.objects.create(system="orders", record_id="A-1", data={})
    assert call(bearer, "get", "/sandbox/orders/records/A-1").status_code == 200
    assert slept == [MAX_LATENCY_MS / 1000]


@pytest.mark.parametrize("raw", ['{"a": "x\\u0000"}', '{"\\ud800": 1}', "[1]", "nope"])
def test_a_body_the_sandbox_cannot_store_is_a_400_not_a_500(bearer, raw):
    client = bearer
    client.raise_request_exception = False
    put = client.put("/sandbox/orders/records/A-1", raw, content_type="application/json")
    post = client.post(
        "/sandbox/payments/effects/", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k"
    )
    assert (put.status_code, post.status_code) == (400, 400)
    assert not Record.objects.exists() and not Effect.objects.exists()


def test_an_enabled_sandbox_without_a_token_refuses_to_start_in_production():
    env = production_env(SANDBOX_ENABLED="1")
    del env["SANDBOX_TOKEN"]
    result = manage(["check"], env)
    assert result.returncode != 0
    assert "SANDBOX_ENABLED=1 with DEBUG off needs SANDBOX_TOKEN" in result.stderr


# In a production process (DEBUG off), a stranger's GET: not served by default, 401 once enabled.
STRANGER = "from django.test import Client; print(Client().get('/sandbox/orders/records/A-1').status_code)"
LOCAL = {"SECURE_SSL_REDIRECT": "0", "ALLOWED_HOSTS": "testserver"}


def test_the_sandbox_is_not_served_by_default_in_production():
    result = manage(["shell", "-c", STRANGER], production_env(**LOCAL))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "404"


def test_an_enabled_production_sandbox_refuses_callers_without_its_token():
    result = manage(["shell", "-c", STRANGER], production_env(SANDBOX_ENABLED="1", **LOCAL))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "401"
