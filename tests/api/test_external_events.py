"""POST /api/tasks/<id>/external-events/: delivering an outside event to a task.

A NUL or a lone surrogate anywhere in the event (value or key) is a 400 naming where it
sits, and nothing is stored: before, a lone surrogate reached the database as a 500.
"""

from __future__ import annotations

import pytest

from tasks.models import ExternalEvent
from tests.api.conftest import no_raise, post_raw, url
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db


POISONED_EVENTS = {
    "nul-value": ('{"event_key": "k", "event_type": "t", "payload": {"a": "x\\u0000"}}', "payload.a"),
    "surrogate-value": ('{"event_key": "k", "event_type": "t", "payload": {"a": "\\ud800"}}', "payload.a"),
    "nul-key": ('{"event_key": "k", "event_type": "t", "payload": {"a\\u0000": 1}}', "payload"),
    "surrogate-key": ('{"event_key": "k", "event_type": "t", "payload": {"\\udfff": 1}}', "payload"),
    "nested": (
        '{"event_key": "k", "event_type": "t", "payload": {"items": [{"sku": "\\ud800"}]}}',
        "payload.items[0].sku",
    ),
}


@pytest.mark.parametrize(("raw", "where"), POISONED_EVENTS.values(), ids=POISONED_EVENTS.keys())
def test_an_external_event_with_an_unstorable_payload_is_a_400_naming_where(operator, acme, raw, where):
    task = make_task(acme)
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 400
    [message] = response.json()["payload"]
    assert message.startswith(f"{where} ")
    assert not ExternalEvent.objects.filter(task=task).exists()


@pytest.mark.parametrize("key", ["k\\u0000", "k\\ud800"], ids=["nul", "surrogate"])
def test_an_event_key_that_cannot_be_stored_is_a_400_on_event_key(operator, acme, key):
    task = make_task(acme)
    raw = f'{{"event_key": "{key}", "event_type": "t", "payload": {{}}}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 400
    assert "event_key" in response.json()
    assert not ExternalEvent.objects.filter(task=task).exists()
