"""The digest an approval is bound to: SHA-256 over canonical JSON of the consequential fields.

Pure functions: no database, no network.
"""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import datetime
from decimal import Decimal

import pytest

from approvals.digest import digest
from approvals.services import consequential_fields
from tasks import registry

PAY_REFUND = registry.get("refund_request").step("pay_refund")
FACTS = {
    "order_id": "A-1",
    "customer_email": "c@example.com",
    "amount": "10.00",
    "currency": "USD",
    "refund_card": "visa-4242",
    "triage": "refund",
}


def test_the_digest_is_a_sha256_hex_string():
    assert re.fullmatch(r"[0-9a-f]{64}", digest({"amount": "10.00"}))


def test_key_order_does_not_change_the_digest():
    first = {"kind": "refund", "amount": "10.00", "nested": {"a": 1, "b": [1, 2]}}
    second = {"nested": {"b": [1, 2], "a": 1}, "amount": "10.00", "kind": "refund"}
    assert digest(first) == digest(second)


def test_whitespace_between_json_tokens_does_not_change_the_digest():
    compact = '{"kind":"refund","amount":25,"lines":[1,2]}'
    spaced = '{\n  "kind" : "refund",\n\t"amount":   25 ,  "lines" : [ 1 , 2 ]\n}'
    assert digest(json.loads(compact)) == digest(json.loads(spaced))


def test_nfc_and_nfd_spellings_of_the_same_string_agree():
    composed = unicodedata.normalize("NFC", "Café Müller")
    decomposed = unicodedata.normalize("NFD", "Café Müller")
    assert composed != decomposed  # different code points, same text
    assert digest({"customer": composed}) == digest({"customer": decomposed})


@pytest.mark.parametrize("same", [25.0, Decimal("25.00"), Decimal("25"), Decimal("2.5E+1")])
def test_the_same_amount_written_differently_agrees(same):
    assert digest({"amount": 25}) == digest({"amount": same})


def test_a_different_amount_disagrees():
    assert digest({"amount": Decimal("25.00")}) != digest({"amount": Decimal("25.01")})


def test_an_order_number_with_leading_zeros_stays_distinct_from_the_number():
    assert digest({"order_id": "00123"}) != digest({"order_id": 123})
    assert digest({"order_id": "00123"}) != digest({"order_id": "123"})


def test_a_number_and_the_same_digits_as_a_string_disagree():
    # JSON tells 25 from "25", and so does the system the effect is sent to: the binding must too.
    assert digest({"amount": 25}) != digest({"amount": "25"})


def test_list_order_is_significant():
    assert digest({"lines": ["a", "b"]}) != digest({"lines": ["b", "a"]})


def test_a_value_without_a_canonical_form_is_refused():
    with pytest.raises(TypeError):
        digest({"when": datetime(2026, 1, 1)})


def test_the_consequential_fields_name_the_step_the_connector_and_the_effect():
    fields = consequential_fields(PAY_REFUND, FACTS)
    assert fields == {
        "step": "pay_refund",
        "connector": "payments",
        "effect": {
            "kind": "refund",
            "order_id": "A-1",
            "amount": "10.00",
            "currency": "USD",
            "card": "visa-4242",
        },
    }


@pytest.mark.parametrize(
    ("fact", "changed"),
    [
        ("order_id", "A-2"),
        ("amount", "10.01"),
        ("currency", "EUR"),
        ("refund_card", "mastercard-1111"),
    ],
)
def test_any_changed_consequential_field_changes_the_digest(fact, changed):
    before = digest(consequential_fields(PAY_REFUND, FACTS))
    after = digest(consequential_fields(PAY_REFUND, {**FACTS, fact: changed}))
    assert before != after


@pytest.mark.parametrize("field", ["step", "connector"])
def test_the_same_effect_through_another_step_or_connector_changes_the_digest(field):
    fields = consequential_fields(PAY_REFUND, FACTS)
    assert digest(fields) != digest({**fields, field: "something-else"})


def test_a_fact_the_effect_does_not_use_leaves_the_digest_alone():
    before = digest(consequential_fields(PAY_REFUND, FACTS))
    after = digest(consequential_fields(PAY_REFUND, {**FACTS, "triage": "escalate", "note": "x"}))
    assert before == after
