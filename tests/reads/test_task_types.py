"""The task-types read: one query for the list, the schema marks what is sensitive and judges input
as the input model does."""

from __future__ import annotations

import jsonschema
import pytest

from reads import task_types
from tests.conftest import REFUND_INPUT

pytestmark = pytest.mark.django_db


def test_the_list_of_contracts_is_one_query(django_assert_num_queries):
    with django_assert_num_queries(1):
        names = [each.name for each in task_types.contracts()]
    assert "refund_request" in names and names == sorted(names)


def test_a_refund_requests_schema_accepts_its_input_and_refuses_a_missing_field():
    schema = task_types.contract("refund_request").input_schema
    jsonschema.Draft202012Validator(schema).validate(REFUND_INPUT)
    wrong = {key: value for key, value in REFUND_INPUT.items() if key != "order_id"}
    assert not jsonschema.Draft202012Validator(schema).is_valid(wrong)
    assert schema["properties"]["customer_email"]["writeOnly"] is True


def test_a_refund_always_needs_an_approver_and_a_payment_only_under_the_money_policy():
    refund = task_types.contract("refund_request").approvals
    payment = task_types.contract("pay_invoice").approvals
    assert [(a.step, a.always) for a in refund] == [("pay_refund", True)]
    assert [(a.step, a.always, a.limits["USD"]) for a in payment] == [
        ("pay", False, {"each": "1000", "total": "5000"})
    ]


def test_an_unknown_type_has_no_contract():
    assert task_types.contract("no_such_type") is None
