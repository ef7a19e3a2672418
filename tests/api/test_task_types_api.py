"""``GET /api/task-types/`` and ``/api/task-types/{name}/``: the contract a caller builds its input from.

The input schema is read from the API's answer, as a caller reads it, and must accept every input
the demo starts its tasks with and refuse what the task type refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from demo.cases import CASES
from demo.cases.seeding import Seeding
from tasks import registry
from tasks.models import Policy
from tasks.transitions import Actor
from tenancy.models import Role, Scope
from tenancy.services import token_create
from tests.api.conftest import create_body, post_json
from tests.conftest import REFUND_INPUT, api_client_for, make_user

pytestmark = pytest.mark.django_db

LIST = "/api/task-types/"


def detail(name: str) -> str:
    return f"{LIST}{name}/"


def validator(contract: dict[str, Any]) -> jsonschema.Draft202012Validator:
    schema = contract["input_schema"]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@dataclass(frozen=True)
class Recording(Seeding):
    """A seeding that only notes the input of every task the demo starts (and starts none)."""

    started: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def start(
        self, key: str, task_type: str, objective: str, input: dict[str, Any], *, region: str | None = None
    ) -> None:
        self.started.append((task_type, input))


def seeded_inputs(acme) -> list[tuple[str, dict[str, Any]]]:
    """``(task type, input)`` of every task ``seed_demo`` starts in a tenant."""
    seeding = Recording(
        tenant=acme, operator=None, approver=None, worker=Actor.worker("w"), now=timezone.now()
    )
    for case in CASES:
        case(seeding)
    return seeding.started


# --- the contract --------------------------------------------------------------------------------


def test_the_list_holds_every_registered_type_by_name_in_the_apis_list_envelope(operator):
    response = api_client_for(operator).get(LIST)
    assert response.status_code == 200
    body = response.json()
    assert (body["next"], body["previous"]) == (None, None)
    assert [each["name"] for each in body["results"]] == registry.names()


def test_one_type_answers_its_whole_contract(operator):
    refund = api_client_for(operator).get(detail("refund_request")).json()
    assert refund["description"] == registry.get("refund_request").description
    assert len(refund["version"]) == 16 and refund["policy_version"]
    assert "customer_email" in refund["sensitive_fields"] and "order_id" not in refund["sensitive_fields"]
    assert "refund_card" in refund["sensitive_facts"]
    email = next(f for f in refund["input_fields"] if f["name"] == "customer_email")
    assert email["sensitive"] is True and email["required"] is True
    assert [step["name"] for step in refund["steps"]][:1] == [registry.get("refund_request").steps[0].name]
    (pay,) = refund["approvals"]
    assert (pay["step"], pay["always"], pay["approver_role"]) == ("pay_refund", True, Role.APPROVER)
    assert pay["expires_after_seconds"] > 0


def test_the_list_and_the_detail_say_the_same(operator):
    client = api_client_for(operator)
    for listed in client.get(LIST).json()["results"]:
        assert client.get(detail(listed["name"])).json() == listed


def test_a_payment_needs_an_approver_only_above_its_money_limits(operator):
    (pay,) = api_client_for(operator).get(detail("pay_invoice")).json()["approvals"]
    assert pay["always"] is False
    assert pay["limits"]["USD"] == {"each": "1000", "total": "5000"}
    assert pay["window_seconds"] > 0 and "limit" in pay["summary"]


def test_sensitive_input_fields_are_marked_write_only_in_the_schema(operator):
    for contract in api_client_for(operator).get(LIST).json()["results"]:
        properties = contract["input_schema"]["properties"]
        for name, schema in properties.items():
            marked = name in contract["sensitive_fields"]
            assert schema.get("writeOnly", False) is marked, (contract["name"], name)
            assert schema.get("x-sensitive", False) is marked, (contract["name"], name)


def test_the_version_changes_when_the_policy_in_force_does_and_only_for_that_type(operator):
    client = api_client_for(operator)
    before = {each["name"]: each["version"] for each in client.get(LIST).json()["results"]}
    Policy.objects.update_or_create(task_type="refund_request", defaults={"version": "2099-01"})
    refund = client.get(detail("refund_request")).json()
    assert refund["policy_version"] == "2099-01" and refund["version"] != before["refund_request"]
    after = {each["name"]: each["version"] for each in client.get(LIST).json()["results"]}
    assert {name for name in before if before[name] != after[name]} == {"refund_request"}


def test_an_unknown_type_is_404(operator):
    assert api_client_for(operator).get(detail("no_such_type")).status_code == 404


# --- the schema accepts what the API accepts ------------------------------------------------------


def test_the_schema_accepts_the_input_of_every_task_the_demo_starts(operator, acme):
    client = api_client_for(operator)
    contracts = {each["name"]: each for each in client.get(LIST).json()["results"]}
    started = seeded_inputs(acme)
    demo_types = {"refund_request", "order_lookup", "order_batch", "pay_invoice", "support_agent"}
    assert {task_type for task_type, _ in started} == demo_types & set(registry.names())
    for task_type, given in started:
        errors = [e.message for e in validator(contracts[task_type]).iter_errors(given)]
        assert errors == [], (task_type, given)


def test_the_schema_refuses_what_task_creation_refuses(operator, acme):
    schema = validator(api_client_for(operator).get(detail("refund_request")).json())
    wrongs = [
        {key: value for key, value in REFUND_INPUT.items() if key != "order_id"},  # a required field missing
        {**REFUND_INPUT, "order_id": 7},  # the wrong type
    ]
    for wrong in wrongs:
        assert not schema.is_valid(wrong), wrong
        created = post_json(api_client_for(operator), "/api/tasks/", create_body(tenant="acme", input=wrong))
        assert created.status_code == 400 and "input" in created.json(), wrong
    assert schema.is_valid(REFUND_INPUT)


# --- who sees it -----------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["operator", "approver", "auditor", "admin_user", "integrator", "outsider"])
def test_every_role_of_any_tenant_reads_the_contracts(who, request):
    client = api_client_for(request.getfixturevalue(who))
    assert len(client.get(LIST).json()["results"]) == len(registry.names())
    assert client.get(detail("refund_request")).status_code == 200


def test_a_user_with_no_role_lists_none_and_reads_none(acme):
    client = api_client_for(make_user("nobody"))
    assert client.get(LIST).json()["results"] == []
    assert client.get(detail("refund_request")).status_code == 404


def test_an_anonymous_caller_is_401():
    assert APIClient().get(LIST).status_code == 401
    assert APIClient().get(detail("refund_request")).status_code == 401


@pytest.mark.parametrize(("scope", "status"), [(Scope.READ, 200), (Scope.INTEGRATE, 403)])
def test_a_token_needs_the_read_scope(operator, scope, status):
    _, key = token_create(operator, scopes=[scope], expires_at=timezone.now() + timedelta(days=1))
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get(LIST).status_code == status
    assert client.get(detail("refund_request")).status_code == status


def test_reading_the_list_costs_a_fixed_number_of_queries(operator, django_assert_max_num_queries):
    client = api_client_for(operator)
    with django_assert_max_num_queries(2):  # the caller's roles, the policy versions in force
        assert client.get(LIST).status_code == 200


# --- the OpenAPI document --------------------------------------------------------------------------


def test_the_openapi_document_describes_both_routes(operator):
    document = api_client_for(operator).get("/api/schema/", {"format": "json"}).json()
    page = document["paths"]["/api/task-types/"]["get"]["responses"]["200"]["content"]["application/json"]
    assert page["schema"] == {"$ref": "#/components/schemas/TaskTypePage"}
    one = document["paths"]["/api/task-types/{task_type}/"]["get"]
    assert one["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TaskTypeOut"
    }
    assert "404" in one["responses"]
    (parameter,) = one["parameters"]
    assert parameter["schema"]["enum"] == registry.names()
    components = document["components"]["schemas"]
    assert components["TaskTypePage"]["properties"]["results"]["items"] == {
        "$ref": "#/components/schemas/TaskTypeOut"
    }
    assert set(components["TaskTypeOut"]["required"]) >= {
        "name",
        "description",
        "version",
        "input_schema",
        "sensitive_fields",
        "steps",
        "approvals",
    }
