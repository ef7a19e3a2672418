"""Wrong API tokens sent to ``/a2a/`` are counted per address in the REST API's budget.

Before, ``/a2a/`` looked every key up with no count at all: keys could be guessed there at whatever
speed the server answered, while the REST API answered 429 past the anonymous rate.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from tenancy.models import ApiToken
from tenancy.services import token_create, token_still_usable
from tests.a2a.test_jsonrpc import key_for
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

GET_TASK = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}})


@pytest.fixture
def hourly_anon_rate(monkeypatch):
    monkeypatch.setattr(SimpleRateThrottle, "THROTTLE_RATES", {"user": "2000/hour", "anon": "60/hour"})


def a2a_status(client, key: str) -> int:
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {key}"}
    return client.post("/a2a/", GET_TASK, content_type="application/json", headers=headers).status_code


def test_wrong_tokens_over_a2a_and_rest_share_one_budget_and_then_even_a_right_key_waits(
    client, settings, hourly_anon_rate, acme
):
    settings.ALLOWED_HOSTS = ["testserver"]
    right = key_for(acme)
    assert a2a_status(client, right) == 200  # a right key is given back: it uses none of the budget
    answers = Counter(a2a_status(client, f"wrong-{n}") for n in range(40))
    answers += Counter(
        client.get("/api/tasks/", headers={"Authorization": f"Token wrong-rest-{n}"}).status_code
        for n in range(40)
    )
    assert answers == Counter({401: 60, 429: 20}), answers
    refused = client.post(
        "/a2a/",
        GET_TASK,
        content_type="application/json",
        headers={"A2A-Version": "1.0", "Authorization": f"Bearer {right}"},
    )
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert refused.json()["error"]["code"] == -32600 and "id" in refused.json()


@pytest.mark.django_db
def test_a_stream_s_token_check_is_the_authentication_rule(acme):
    """The mid-stream check (``tenancy.services.token_still_usable``) refuses what authentication
    refuses: a revoked or expired token, an inactive user, a deleted token."""
    user = make_user("stream-agent", acme, "integrator")

    def fresh(**changes) -> int:
        token, _ = token_create(user, scopes="read,integrate", expires_at=None)
        ApiToken.objects.filter(pk=token.pk).update(**changes)
        return token.pk

    assert token_still_usable(fresh())
    assert not token_still_usable(fresh(revoked_at=timezone.now()))
    assert not token_still_usable(fresh(expires_at=timezone.now()))
    deleted = fresh()
    ApiToken.objects.filter(pk=deleted).delete()
    assert not token_still_usable(deleted)
    live = fresh()
    user.is_active = False
    user.save(update_fields=["is_active"])
    assert not token_still_usable(live)
