"""POST /api/tasks/: who may create, idempotent creation, input validation, hostile bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest

from audit.models import TransitionEvent
from tasks.models import Task
from tenancy.models import Membership, Role
from tests.api.conftest import TASKS, create_body, no_raise, post_json, post_raw
from tests.conftest import REFUND_INPUT, api_client_for, make_user

pytestmark = pytest.mark.django_db


def test_an_unauthenticated_create_answers_401_and_creates_nothing(acme):
    assert post_json(api_client_for(None), TASKS, create_body()).status_code == 401
    assert not Task.objects.exists()


def test_create_starts_a_ready_task_owned_by_the_caller(operator):
    response = post_json(api_client_for(operator), TASKS, create_body())
    assert response.status_code == 201
    body = response.json()
    assert (body["state"], body["state_version"], body["tenant"], body["owner"]) == (
        "ready",
        1,
        "acme",
        "acme-operator",
    )
    # As the task type accepted it, the sensitive e-mail masked (tests/security/test_reveal.py).
    assert body["input"] == {**REFUND_INPUT, "customer_email": "••••", "reason": ""}
    assert Task.objects.get(pk=body["id"]).owner == operator


def test_an_admin_may_create_a_task(admin_user):
    assert post_json(api_client_for(admin_user), TASKS, create_body()).status_code == 201


def test_the_same_idempotency_key_twice_returns_the_first_task(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    second = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Task.objects.filter(idempotency_key="order-A-1").count() == 1
    assert TransitionEvent.objects.filter(task_id=first.json()["id"]).count() == 1


def test_the_same_idempotency_key_with_a_different_body_is_a_409_conflict(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    other = create_body(idempotency_key="order-A-1", input={**REFUND_INPUT, "amount": "99.00"})
    response = post_json(client, TASKS, other)
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_conflict"
    assert response.json()["task"] == first.json()["id"]
    assert Task.objects.count() == 1


def test_the_same_idempotency_key_in_two_tenants_starts_two_tasks(operator, outsider):
    mine = post_json(api_client_for(operator), TASKS, create_body(idempotency_key="shared"))
    theirs = post_json(api_client_for(outsider), TASKS, create_body(idempotency_key="shared"))
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]
    assert (mine.json()["tenant"], theirs.json()["tenant"]) == ("acme", "globex")
    assert Task.objects.filter(idempotency_key="shared").count() == 2


def test_creates_without_an_idempotency_key_start_separate_tasks(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body())
    second = post_json(client, TASKS, create_body())
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]


def test_an_unknown_task_type_is_a_400_on_task_type(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(task_type="launch_rockets"))
    assert response.status_code == 400
    assert "task_type" in response.json()
    assert not Task.objects.exists()


def test_a_missing_objective_is_a_400_on_objective(operator):
    body = create_body()
    del body["objective"]
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "objective" in response.json()


@pytest.mark.parametrize(
    "value", [[], ["a"], "text", 7, None], ids=["empty-list", "list", "string", "int", "null"]
)
def test_an_input_that_is_not_an_object_is_a_400_on_input(operator, value):
    response = post_json(api_client_for(operator), TASKS, create_body(input=value))
    assert response.status_code == 400
    assert "input" in response.json()
    assert not Task.objects.exists()


@pytest.mark.parametrize("amount", ["-5.00", "0", "abc", "1.234", "1" * 20, True])
def test_an_amount_the_task_type_refuses_is_a_400_on_input_amount(operator, amount):
    body = create_body(input={**REFUND_INPUT, "amount": amount})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "amount" in response.json()["input"]


@pytest.mark.parametrize("email", ["not-an-email", "", "a b@example.com", 42])
def test_a_bad_customer_email_is_a_400_on_input_customer_email(operator, email):
    body = create_body(input={**REFUND_INPUT, "customer_email": email})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "customer_email" in response.json()["input"]


def test_an_input_field_the_task_type_does_not_know_is_a_400(operator):
    body = create_body(input={**REFUND_INPUT, "discount": "100%"})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "discount" in response.json()["input"]


def test_a_missing_required_input_field_is_a_400_naming_it(operator):
    body = create_body(input={k: v for k, v in REFUND_INPUT.items() if k != "order_id"})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "order_id" in response.json()["input"]


def test_an_unparseable_deadline_is_a_400_on_deadline(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(deadline="next tuesday"))
    assert response.status_code == 400
    assert "deadline" in response.json()


def test_an_auditor_may_not_create_a_task(auditor):
    assert post_json(api_client_for(auditor), TASKS, create_body()).status_code == 403
    assert not Task.objects.exists()


def test_an_approver_may_not_create_a_task(approver):
    assert post_json(api_client_for(approver), TASKS, create_body()).status_code == 403
    assert not Task.objects.exists()


def test_a_user_in_no_tenant_may_not_create_a_task(db):
    loner = make_user("loner")
    assert post_json(api_client_for(loner), TASKS, create_body()).status_code == 403


@pytest.fixture
def two_tenant_operator(acme, globex):
    user = make_user("roaming-operator", acme, Role.OPERATOR)
    Membership.objects.create(user=user, tenant=globex, role=Role.OPERATOR)
    return user


def test_an_operator_in_two_tenants_must_name_the_tenant(two_tenant_operator):
    response = post_json(api_client_for(two_tenant_operator), TASKS, create_body())
    assert response.status_code == 400
    assert "tenant" in response.json()
    assert not Task.objects.exists()


def test_an_operator_in_two_tenants_creates_in_the_tenant_named(two_tenant_operator):
    response = post_json(api_client_for(two_tenant_operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 201
    assert response.json()["tenant"] == "globex"
    assert Task.objects.get().tenant.slug == "globex"


def test_naming_a_tenant_the_caller_is_not_in_is_a_400(operator, globex):
    response = post_json(api_client_for(operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 400
    assert "tenant" in response.json()


def test_naming_a_tenant_where_the_caller_only_audits_is_a_403(operator, globex):
    Membership.objects.create(user=operator, tenant=globex, role=Role.AUDITOR)
    response = post_json(api_client_for(operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 403


def test_an_operator_with_the_longest_allowed_username_can_create_a_task(acme):
    # Django allows 150-character usernames; the audit actor id is "user:<username>".
    long_named = make_user("o" * 150, acme, Role.OPERATOR)
    response = no_raise(api_client_for(long_named)).post(
        TASKS, json.dumps(create_body()), content_type="application/json"
    )
    assert response.status_code == 201


@pytest.mark.parametrize(
    "raw",
    [b'{"task_type": ', b"{'task_type': 'refund_request'}", b"", b"\xff\xfe\x00", b'{"a": NaN}', b"[1, 2,]"],
    ids=["truncated", "single-quotes", "empty", "not-utf8", "nan", "trailing-comma"],
)
def test_a_malformed_json_body_is_a_400(operator, raw):
    response = post_raw(api_client_for(operator), TASKS, raw)
    assert response.status_code == 400
    assert not Task.objects.exists()


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/octet-stream"])
def test_a_body_that_is_not_json_is_a_415(operator, content_type):
    response = post_raw(api_client_for(operator), TASKS, json.dumps(create_body()), content_type)
    assert response.status_code == 415
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "overrides",
    [
        {"objective": "refund\x00now"},
        {"idempotency_key": "key\x00"},
        {"input": {**REFUND_INPUT, "order_id": "A\x001"}},
        {"input": {**REFUND_INPUT, "reason": "x\x00"}},
        {"input": {**REFUND_INPUT, "bad\x00key": "x"}},
        {"tenant": "ac\x00me"},
    ],
    ids=["objective", "idempotency-key", "input-value", "input-optional-value", "input-key", "tenant"],
)
def test_nul_characters_in_create_strings_are_a_400(operator, overrides):
    response = post_json(no_raise(api_client_for(operator)), TASKS, create_body(**overrides))
    assert response.status_code == 400
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "raw",
    [
        '{"task_type": "refund_request", "objective": "\\ud800", "input": {}}',
        '{"task_type": "refund_request", "objective": "x", "input": {"order_id": "\\udfff"}}',
    ],
    ids=["objective", "input"],
)
def test_lone_surrogates_in_create_strings_are_a_400(operator, raw):
    assert post_raw(no_raise(api_client_for(operator)), TASKS, raw).status_code == 400


def test_a_huge_amount_is_a_400_on_input_amount(operator):
    body = create_body(input={**REFUND_INPUT, "amount": 10**60})
    response = post_json(no_raise(api_client_for(operator)), TASKS, body)
    assert response.status_code == 400
    assert "amount" in response.json()["input"]


def test_an_oversized_objective_is_a_400(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(objective="x" * 5001))
    assert response.status_code == 400
    assert "objective" in response.json()


def test_a_deeply_nested_input_within_the_parsers_reach_is_a_400(operator):
    nested: Any = 1
    for _ in range(300):
        nested = {"a": nested}
    body = create_body(input={**REFUND_INPUT, "extra": nested})
    assert post_json(no_raise(api_client_for(operator)), TASKS, body).status_code == 400


@pytest.mark.parametrize("raw", ["[" * 50000, '{"a":' * 5000], ids=["arrays", "objects"])
def test_a_deeply_nested_create_body_is_a_4xx_not_a_500(operator, raw):
    response = post_raw(no_raise(api_client_for(operator)), TASKS, raw)
    assert 400 <= response.status_code < 500
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "body", [[], [1, 2], "text", 3, None, True], ids=["list", "list2", "str", "int", "null", "bool"]
)
def test_a_json_body_that_is_not_an_object_is_a_400(operator, body):
    assert post_json(api_client_for(operator), TASKS, body).status_code == 400


def test_a_surrogate_in_create_input_keys_is_a_400_on_input(operator):
    raw = json.dumps(create_body()).replace('"order_id"', '"\\ud800": 1, "order_id"', 1)
    response = post_raw(no_raise(api_client_for(operator)), TASKS, raw)
    assert response.status_code == 400
    assert response.json()["input"] == [
        "input has a key '\\ud800' that contains a lone surrogate U+D800 (at position 0)"
    ]
    assert not Task.objects.exists()
