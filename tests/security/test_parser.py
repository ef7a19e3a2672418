"""Text no database column can hold is a 400 at the API's parser, for every endpoint (issue 12, item 1).

Reproduced before: ``{"payload": {"a": "\\ud800"}}`` to ``/external-events/`` or ``/input/`` (or the
lone surrogate as a key) reached PostgreSQL and came back as a ``DataError`` 500. The bodies here are
raw JSON text, so the escapes arrive exactly as a client would send them.
"""

from __future__ import annotations

import uuid

import pytest
from django.urls import URLPattern

from api.urls import urlpatterns
from tasks.models import Task
from tasks.states import State
from tests.api.conftest import no_raise, post_raw, url, waiting_for_input
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db

# Raw JSON text: (body, the field the 400 is filed under, what its message says).
POISONED = {
    "surrogate-value": (
        '{"payload": {"a": "\\ud800"}}',
        "payload",
        "payload.a contains a lone surrogate U+D800",
    ),
    "surrogate-key": ('{"payload": {"\\ud800": 1}}', "payload", "payload has a key '\\ud800' that contains"),
    "nul-value": ('{"payload": {"a": "x\\u0000"}}', "payload", "payload.a contains a NUL character"),
    "nul-key-deep": (
        '{"payload": {"a": [{"b": {"c\\u0000": 1}}]}}',
        "payload",
        "payload.a[0].b has a key 'c\\u0000' that contains a NUL character",
    ),
}


def with_event_key(body: str) -> str:
    return body.replace('{"payload"', '{"event_key": "e-1", "event_type": "shipment.returned", "payload"', 1)


@pytest.mark.parametrize(("body", "field", "message"), POISONED.values(), ids=POISONED.keys())
def test_an_external_event_that_cannot_be_stored_is_a_400_naming_it(operator, acme, body, field, message):
    task = make_task(acme)
    response = post_raw(
        no_raise(api_client_for(operator)), url(task, "external-events"), with_event_key(body)
    )
    assert response.status_code == 400, response.content
    [said] = response.json()[field]
    assert message in said
    assert Task.objects.get(pk=task.pk).state_version == task.state_version


@pytest.mark.parametrize(("body", "field", "message"), POISONED.values(), ids=POISONED.keys())
def test_an_input_answer_that_cannot_be_stored_is_a_400_naming_it(operator, acme, body, field, message):
    task = waiting_for_input(make_task(acme))
    raw = body.replace('{"payload"', f'{{"expected_version": {task.state_version}, "payload"', 1)
    response = post_raw(no_raise(api_client_for(operator)), url(task, "input"), raw)
    assert response.status_code == 400, response.content
    [said] = response.json()[field]
    assert message in said
    assert Task.objects.get(pk=task.pk).state == State.WAITING_INPUT


def test_a_top_level_key_that_cannot_be_stored_is_a_400_saying_so(operator, acme):
    task = make_task(acme)
    raw = '{"\\ud800": 1, "event_key": "e-1", "event_type": "x", "payload": {}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 400
    assert "has a key '\\ud800' that contains a lone surrogate" in response.json()["detail"]


def test_a_body_that_is_a_poisoned_string_is_a_400(operator, acme):
    response = post_raw(no_raise(api_client_for(operator)), "/api/tasks/", '"\\udfff"')
    assert response.status_code == 400
    assert "lone surrogate U+DFFF" in response.json()["detail"]


def test_a_surrogate_pair_is_ordinary_text_and_accepted(operator, acme):
    """``\\ud83d\\ude00`` is one character (😀): only a lone half is refused."""
    task = make_task(acme)
    raw = with_event_key('{"payload": {"mood": "\\ud83d\\ude00"}}')
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 200, response.content
    assert response.json()["applied"] is True


def _api_paths(task: Task) -> list[str]:
    """Every API URL, filled in with ``task`` (or an unknown approval), from the URL conf itself."""
    paths = []
    for pattern in urlpatterns:
        assert isinstance(pattern, URLPattern)
        route = str(pattern.pattern)
        route = route.replace("<uuid:task_id>", str(task.id)).replace("<uuid:request_id>", str(uuid.uuid4()))
        route = route.replace("<int:alert_id>", "987654321")  # no such alert: the body is read first or 404
        route = route.replace("<str:task_type>", "refund_request")
        assert "<" not in route, f"fill in {route} here"
        paths.append(f"/api/{route}")
    return paths


def test_no_api_endpoint_answers_a_poisoned_body_with_a_500(admin_user, acme):
    """Every endpoint, the ones added later included: a 400 where it reads a body, never a 500."""
    task = make_task(acme)
    client = no_raise(api_client_for(admin_user))
    raw = '{"expected_version": 1, "reason": "r\\ud800", "payload": {"\\u0000": 1}, "event_key": "k"}'
    answers = {path: post_raw(client, path, raw).status_code for path in _api_paths(task)}
    assert all(status in (400, 404, 405) for status in answers.values()), answers
    assert answers[url(task, "cancel")] == answers[url(task, "input")] == 400, answers
