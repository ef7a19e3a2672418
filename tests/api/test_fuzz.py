"""Fuzzing the task API: no request body or query may cause a server error, and
every answer to a write is one the OpenAPI document lists for that operation.

Bodies come from the served OpenAPI request-body schemas (``$ref`` resolved into
``components``), from the documented keys carrying arbitrary JSON, from
arbitrary JSON, and from plausible requests that reach the success paths.

hypothesis-jsonschema 0.23.1 cannot draw object schemas with this Hypothesis
(``'many' object has no attribute 'more'``), so objects are built here with
``fixed_dictionaries`` and only leaf schemas go through ``from_schema``.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from hypothesis_jsonschema import from_schema
from rest_framework.test import APIClient

from runtime import controls
from tasks import registry
from tasks.models import Task
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db

TASKS = "/api/tasks/"


def fuzz(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,  # write no example database outside tests/
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# --- the OpenAPI document ----------------------------------------------------------------------


@functools.cache
def openapi() -> dict[str, Any]:
    """The served document (to a signed-in reader). drf-spectacular answers YAML unless asked for JSON."""
    client = APIClient()
    client.force_authenticate(get_user_model()(username="schema-reader"))  # unsaved: no database needed
    response = client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200, response.content[:200]
    return json.loads(response.content)


def resolve(node: Any, doc: dict[str, Any]) -> Any:
    """``node`` with every ``#/components/...`` reference replaced by a copy of its target."""
    if isinstance(node, list):
        return [resolve(item, doc) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return resolve({**copy.deepcopy(target), **siblings}, doc)
    return {key: resolve(value, doc) for key, value in node.items()}


def operation(path: str, method: str) -> dict[str, Any]:
    return openapi()["paths"][path][method]


def documented(path: str, method: str) -> set[int]:
    return {int(code) for code in operation(path, method)["responses"]}


def request_schema(path: str, method: str) -> dict[str, Any]:
    body = operation(path, method)["requestBody"]["content"]["application/json"]["schema"]
    return resolve(body, openapi())


CONTROL_PATH = "/api/tasks/{task_id}/%s/"

# --- strategies ----------------------------------------------------------------------------------

EDGE_INTS = [0, -1, 1, 2, 2**31 - 1, 2**31, 2**63, -(2**63), 10**30]
JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.sampled_from(EDGE_INTS) | st.floats() | st.text()
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)

# JSON Schema keywords a leaf keeps; OpenAPI and pydantic annotations are dropped.
LEAF_KEYWORDS = {
    "type",
    "enum",
    "const",
    "format",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "items",
    "minItems",
    "maxItems",
    "anyOf",
    "oneOf",
}


def from_openapi(schema: dict[str, Any]) -> SearchStrategy[Any]:
    """Values valid for an OpenAPI 3.0 schema (already resolved)."""
    if schema.get("nullable"):
        rest = {key: value for key, value in schema.items() if key != "nullable"}
        return st.none() | from_openapi(rest)
    if len(schema.get("allOf", ())) == 1:
        rest = {key: value for key, value in schema.items() if key != "allOf"}
        return from_openapi({**schema["allOf"][0], **rest})
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: from_openapi(properties[name]) for name in sorted(required)},
            optional={name: from_openapi(sub) for name, sub in properties.items() if name not in required},
        )
    leaf = {key: value for key, value in schema.items() if key in LEAF_KEYWORDS}
    return from_schema(leaf) if leaf else JSON_VALUES


def schema_bodies(path: str, method: str) -> SearchStrategy[Any]:
    return st.deferred(lambda: from_openapi(request_schema(path, method)))


def documented_keys_with_any_values(path: str, method: str) -> SearchStrategy[Any]:
    def build() -> SearchStrategy[Any]:
        names = sorted(request_schema(path, method)["properties"])
        return st.fixed_dictionaries({}, optional={name: JSON_VALUES for name in names})

    return st.deferred(build)


def task_inputs() -> SearchStrategy[Any]:
    kinds = [registry.get(name).input_model.model_json_schema() for name in registry.names()]
    return st.one_of([from_openapi(schema) for schema in kinds]) | JSON_VALUES


PLAUSIBLE_CREATE = st.fixed_dictionaries(
    {
        "task_type": st.sampled_from(registry.names()) | st.text(max_size=20),
        "objective": st.text(min_size=1, max_size=300),
        "input": task_inputs(),
    },
    optional={
        "idempotency_key": st.sampled_from(["k1", "k2", "k3"]),
        "deadline": st.none() | from_schema({"type": "string", "format": "date-time"}),
        "tenant": st.sampled_from(["acme", "globex", "nowhere", ""]),
    },
)

PLAUSIBLE_CONTROL = st.fixed_dictionaries(
    {
        "expected_version": st.sampled_from([1, 1, 2]) | st.integers(),
        "reason": st.text(max_size=50),
    },
    optional={
        "scope": st.sampled_from([*controls.CANCEL_SCOPES, "everything"]),
        "escalate_to": st.sampled_from([*controls.ESCALATION_ROLES, "president"]),
    },
)


def cursors() -> SearchStrategy[str]:
    """Cursors DRF decodes (base64 query strings) with any offset, direction and position."""
    position = st.one_of(
        st.uuids().map(str),
        st.sampled_from(["0", "1", "-1", "abc", "1.5"]),
        st.integers().map(str),
        st.text(max_size=20),
    )
    offset = st.integers(-3, 20).map(str) | st.sampled_from(["1000", "5000", "x"])
    parts = st.fixed_dictionaries({"p": position}, optional={"o": offset, "r": st.sampled_from(["0", "1"])})
    encoded = parts.map(lambda qs: "&".join(f"{k}={v}" for k, v in qs.items())).map(
        lambda raw: base64.b64encode(raw.encode()).decode()
    )
    return st.one_of(encoded, encoded, encoded, st.text(max_size=30))


LIST_QUERIES = st.fixed_dictionaries(
    {},
    optional={
        "state": st.lists(st.sampled_from(["ready", "quarantined", "nope"]) | st.text(), max_size=3),
        "task_type": st.sampled_from(registry.names()) | st.text(max_size=20),
        "tenant": st.text(max_size=20),
        "page_size": st.integers(-5, 1000).map(str) | st.text(max_size=5),
        "cursor": cursors(),
    },
)

PAGE_QUERIES = st.fixed_dictionaries(
    {}, optional={"page_size": st.integers(-5, 1000).map(str) | st.text(max_size=5), "cursor": cursors()}
)


# --- checks ----------------------------------------------------------------------------------------


def assert_documented(response, path: str, method: str, body: Any) -> None:
    assert response.status_code < 500, (response.status_code, body)
    answer = (response.status_code, response.content[:300], body)
    assert response.status_code in documented(path, method), answer
    assert isinstance(response.json(), dict)


def create(client, body: Any):
    response = client.post(TASKS, json.dumps(body), content_type="application/json")
    assert_documented(response, TASKS, "post", body)
    if response.status_code == 201:
        assert Task.objects.filter(pk=response.json()["id"], tenant__slug="acme").exists()
    return response


def control(client, tenant, name: str, body: Any):
    task = make_task(tenant)
    response = client.post(f"{TASKS}{task.id}/{name}/", json.dumps(body), content_type="application/json")
    assert_documented(response, CONTROL_PATH % name, "post", body)
    if response.status_code != 200:
        assert Task.objects.get(pk=task.pk).state_version == 1  # a refusal changes nothing
    return response


# --- the document itself -----------------------------------------------------------------------------


def test_the_schema_is_served_as_json_with_the_write_operations():
    doc = openapi()
    assert doc["openapi"].startswith("3.")
    assert request_schema(TASKS, "post")["required"] == ["objective", "task_type"]
    assert set(request_schema(CONTROL_PATH % "cancel", "post")["required"]) == {"expected_version", "reason"}


def test_the_schema_documents_the_error_answers_of_the_write_operations():
    assert {400, 403, 409} <= documented(TASKS, "post")
    for name in controls.CONTROLS:
        assert {400, 403, 404, 409} <= documented(CONTROL_PATH % name, "post")


# --- POST /api/tasks/ --------------------------------------------------------------------------------


@fuzz(100)
@given(body=schema_bodies(TASKS, "post"))
def test_create_bodies_drawn_from_the_openapi_schema_get_a_documented_answer(operator, body):
    create(api_client_for(operator), body)


@fuzz(80)
@given(body=documented_keys_with_any_values(TASKS, "post"))
def test_create_bodies_with_the_documented_keys_and_any_values_get_a_documented_answer(operator, body):
    create(api_client_for(operator), body)


@fuzz(80)
@given(body=JSON_VALUES)
def test_arbitrary_json_create_bodies_get_a_documented_answer(operator, body):
    create(api_client_for(operator), body)


@pytest.mark.usefixtures("globex")  # so that naming another tenant is a real choice
@fuzz(100)
@given(body=PLAUSIBLE_CREATE)
def test_plausible_create_bodies_get_a_documented_answer(operator, body):
    create(api_client_for(operator), body)


@fuzz(50)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_sent_as_json_to_create_get_a_documented_answer(operator, raw):
    response = api_client_for(operator).post(TASKS, raw, content_type="application/json")
    assert_documented(response, TASKS, "post", raw)


# --- POST /api/tasks/{id}/cancel/ and /escalate/ -----------------------------------------------------


@fuzz(60)
@given(body=schema_bodies(CONTROL_PATH % "cancel", "post"))
def test_cancel_bodies_drawn_from_the_openapi_schema_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "cancel", body)


@fuzz(50)
@given(body=documented_keys_with_any_values(CONTROL_PATH % "cancel", "post"))
def test_cancel_bodies_with_the_documented_keys_and_any_values_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "cancel", body)


@fuzz(50)
@given(body=JSON_VALUES)
def test_arbitrary_json_cancel_bodies_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "cancel", body)


@fuzz(50)
@given(body=PLAUSIBLE_CONTROL)
def test_plausible_cancel_bodies_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "cancel", body)


@fuzz(50)
@given(body=schema_bodies(CONTROL_PATH % "escalate", "post"))
def test_escalate_bodies_drawn_from_the_openapi_schema_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "escalate", body)


@fuzz(40)
@given(body=JSON_VALUES | PLAUSIBLE_CONTROL)
def test_arbitrary_escalate_bodies_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "escalate", body)


@fuzz(30)
@given(body=PLAUSIBLE_CONTROL)
def test_control_bodies_from_an_auditor_are_refused_with_403(auditor, acme, body):
    assert control(api_client_for(auditor), acme, "cancel", body).status_code == 403


# --- GET queries -------------------------------------------------------------------------------------
# The document lists only 200 for these reads; 400 is what the API answers for bad filters and cursors.


@fuzz(80)
@given(query=LIST_QUERIES)
def test_list_queries_get_200_or_400(operator, acme, query):
    make_task(acme)
    response = api_client_for(operator).get(TASKS, query)
    assert response.status_code in {200, 400}, (response.status_code, query)


@fuzz(60)
@given(query=PAGE_QUERIES)
def test_list_cursors_and_page_sizes_get_200_or_400(operator, acme, query):
    make_task(acme)
    response = api_client_for(operator).get(TASKS, query)
    assert response.status_code in {200, 400}, (response.status_code, query)


@fuzz(40)
@given(query=PAGE_QUERIES)
def test_event_history_queries_get_200_or_400(operator, acme, query):
    task = make_task(acme)
    response = api_client_for(operator).get(f"{TASKS}{task.id}/events/", query)
    assert response.status_code in {200, 400}, (response.status_code, query)


# --- POST /api/tasks/{id}/input/ and /external-events/ --------------------------------------------


@fuzz(60)
@given(body=schema_bodies(CONTROL_PATH % "input", "post") | JSON_VALUES)
def test_input_bodies_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "input", body)


@fuzz(60)
@given(body=schema_bodies(CONTROL_PATH % "external-events", "post") | JSON_VALUES)
def test_external_event_bodies_get_a_documented_answer(operator, acme, body):
    control(api_client_for(operator), acme, "external-events", body)
