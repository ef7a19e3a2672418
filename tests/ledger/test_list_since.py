"""The payment system lists what it holds since a time, over live HTTP (issue 21, item 2).

Recovery after a restore asks each system for the effects it recorded in the window at
risk: our ledger may have forgotten them, the system has not.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from demo.sandbox import views
from demo.sandbox.models import Effect
from ledger.connectors.base import Connector, ListNotSupported, ListUnavailable
from ledger.connectors.http import HTTPConnector

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"


def paid(n: int, prefix: str = "k") -> list[str]:
    keys = [f"{prefix}-{i}" for i in range(n)]
    for key in keys:
        assert HTTPConnector("payments").dispatch(key, {"invoice": key}).status == "succeeded"
    return keys


def test_the_listing_holds_the_effects_recorded_since_and_none_before():
    paid(2, prefix="old")
    Effect.objects.update(created_at=timezone.now() - timedelta(hours=2))
    since = timezone.now() - timedelta(hours=1)
    fresh = paid(3)
    held = HTTPConnector("payments").list_since(since)
    assert [h.key for h in held] == fresh
    first = Effect.objects.get(idempotency_key=fresh[0])
    assert (held[0].status, held[0].record_id) == ("succeeded", str(first.pk))
    assert held[0].created_at == first.created_at


def test_a_long_listing_is_read_page_by_page(monkeypatch):
    monkeypatch.setattr(views, "PAGE_SIZE", 2)  # the live server runs in this process
    keys = paid(5)
    assert [h.key for h in HTTPConnector("payments").list_since(timezone.now() - timedelta(hours=1))] == keys


def test_another_system_effects_are_not_listed():
    paid(1)
    assert HTTPConnector("tickets").list_since(timezone.now() - timedelta(hours=1)) == []


def test_a_since_without_an_offset_is_refused_by_the_system(client, settings):
    response = client.get(
        "/sandbox/payments/effects/?since=2026-01-01T00:00:00",
        headers={"Authorization": f"Bearer {settings.SANDBOX_TOKEN}"},
    )
    assert response.status_code == 400 and "offset" in response.json()["detail"]


def test_a_system_that_does_not_answer_is_unavailable_not_empty(settings):
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox"
    with pytest.raises(ListUnavailable):
        HTTPConnector("payments").list_since(timezone.now())


def test_a_connector_that_cannot_list_says_so():
    class SendOnly(Connector):
        name = "send-only"

    with pytest.raises(ListNotSupported, match="send-only"):
        SendOnly().list_since(timezone.now())
