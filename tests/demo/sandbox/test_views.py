"""The sandbox protocol and its fault controls answer bad input with 400, never 500."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from demo.sandbox.models import Effect, Fault

pytestmark = pytest.mark.django_db


@pytest.fixture
def client(settings):
    """A caller with the sandbox's token (tests/security/test_sandbox_hardening.py: without it, 401)."""
    return Client(headers={"Authorization": f"Bearer {settings.SANDBOX_TOKEN}"})


def post(client, path: str, body, **headers):
    return client.post(path, json.dumps(body), content_type="application/json", **headers)


def test_a_repeated_key_gets_the_first_result_even_when_a_fault_is_queued(client):
    first = post(client, "/sandbox/payments/effects/", {"amount": "1"}, HTTP_IDEMPOTENCY_KEY="k1")
    Fault.objects.create(system="payments", kind="reject")
    again = post(client, "/sandbox/payments/effects/", {"amount": "1"}, HTTP_IDEMPOTENCY_KEY="k1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and Effect.objects.count() == 1


def test_lookup_answers_404_for_an_unknown_key_and_200_for_a_known_one(client):
    post(client, "/sandbox/tickets/effects/", {"kind": "ticket.open"}, HTTP_IDEMPOTENCY_KEY="t-1")
    assert client.get("/sandbox/tickets/effects/t-1").status_code == 200
    assert client.get("/sandbox/tickets/effects/t-2").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {"system": "payments", "kind": "timeout", "remaining": "x"},
        {"system": "payments", "kind": "timeout", "remaining": 0},
        {"system": "payments", "kind": "explode"},
        {"system": "nowhere", "kind": "error"},
        {"system": "payments", "kind": "error", "params": [1]},
        {"system": "payments", "kind": "error", "operation": "teleport"},
        [1, 2],
    ],
)
def test_a_malformed_fault_is_refused_with_400(client, body):
    assert post(client, "/sandbox/faults/", body).status_code == 400
    assert not Fault.objects.exists()


def test_an_odd_fault_header_is_refused_with_400_not_a_500(client):
    response = post(
        client, "/sandbox/payments/effects/", {}, HTTP_IDEMPOTENCY_KEY="k", HTTP_X_SANDBOX_FAULT="latency=²"
    )
    assert response.status_code == 400
    assert not Effect.objects.exists()


def test_a_standing_fault_for_one_key_fails_every_lookup_of_that_key_and_no_other(client):
    post(client, "/sandbox/payments/effects/", {"amount": "1"}, HTTP_IDEMPOTENCY_KEY="other")
    Fault.objects.create(
        system="payments", operation="lookup", kind="error", params={"key": "stuck", "standing": True}
    )
    assert [client.get("/sandbox/payments/effects/stuck").status_code for _ in range(3)] == [503] * 3
    assert client.get("/sandbox/payments/effects/other").status_code == 200
    assert Fault.objects.get().remaining == 1


def test_an_empty_body_performs_nothing(client):
    # What a sender killed between its headers and its body leaves: refused, never read as {}.
    response = client.post("/sandbox/payments/effects/", data=b"", content_type="application/json",
                           HTTP_IDEMPOTENCY_KEY="cut-short")  # fmt: skip
    assert response.status_code == 400 and "the body is empty" in response.json()["detail"]
    assert not Effect.objects.filter(idempotency_key="cut-short").exists()
