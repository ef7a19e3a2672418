"""What a task type must declare about its agent's tools, refused at registration."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from tasks.registry import AgentEffect, AgentEvidence, AgentRun, Complete, TaskType, call_key
from workflows.support_agent import SUPPORT_AGENT

LOOKUP = AgentEvidence("lookup_order", system="orders", record_from="order_id")
REFUND = AgentEffect(
    "refund_order", connector="payments", effect=lambda args, facts: {"kind": "refund", **args}
)
EMAIL = AgentEffect(
    "email_customer",
    connector="email",
    sensitive=frozenset({"to"}),
    effect=lambda args, facts: {"kind": "email", "to": facts["customer_email"]},
)


class Nothing(BaseModel):
    pass


def test_an_undeclared_tool_of_the_agent_is_refused():
    with pytest.raises(ValueError, match=r"\['email_customer'\] are not declared"):
        AgentRun("agent", agent=SUPPORT_AGENT, tools=(LOOKUP, REFUND))


def test_a_declaration_for_a_tool_the_agent_lacks_is_refused():
    stray = AgentEffect("wire_money", connector="payments", effect=lambda args, facts: {})
    with pytest.raises(ValueError, match=r"\['wire_money'\] are not the agent's"):
        AgentRun("agent", agent=SUPPORT_AGENT, tools=(LOOKUP, REFUND, EMAIL, stray))


def test_an_effect_filling_a_key_from_a_sensitive_fact_must_mark_it_sensitive():
    leaky = AgentEffect(
        "email_customer",
        connector="email",
        effect=lambda args, facts: {"kind": "email", "to": facts["customer_email"]},
    )
    with pytest.raises(ValueError, match=r"email_customer.to"):
        TaskType(
            name="leaky",
            description="",
            input_model=Nothing,
            sensitive=frozenset({"customer_email"}),
            steps=(
                AgentRun("agent", next="done", agent=SUPPORT_AGENT, tools=(LOOKUP, REFUND, leaky)),
                Complete("done"),
            ),
        )


def test_a_call_id_becomes_part_of_a_step_name_only_when_short_and_plain():
    assert call_key("call_2_refund_order") == "call_2_refund_order"
    long_or_odd = [call_key("call_" + "x" * 40), call_key("call:1/../2")]
    assert all(key.startswith("h") and len(key) == 25 for key in long_or_odd)
    assert call_key("call:1/../2") != call_key("call:1/../3")


def test_a_call_for_a_zero_or_negative_amount_needs_an_approver():
    from workflows.support_agent import REFUNDS

    refund = AgentEffect("refund_order", connector="payments", money=REFUNDS, effect=lambda a, f: {})
    assert not refund.needs_approval({"amount": "90.00", "currency": "USD"})
    assert refund.needs_approval({"amount": "-5000", "currency": "USD"})
    assert refund.needs_approval({"amount": "0", "currency": "USD"})
