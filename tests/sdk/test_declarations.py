"""What a task type must declare about its agent's tools, refused at registration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from tasks.registry import AgentEffect, AgentEvidence, AgentRun, Complete, TaskType, call_key
from workflows.sdk.support import SUPPORT_AGENT

ROOT = Path(__file__).resolve().parents[2]
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


def test_an_agent_named_by_where_it_lives_is_checked_when_first_imported():
    named = AgentRun("agent", agent="workflows.sdk.support:SUPPORT_AGENT", tools=(LOOKUP, REFUND))
    with pytest.raises(ValueError, match=r"\['email_customer'\] are not declared"):
        named.sdk_agent()
    whole = AgentRun("agent", agent="workflows.sdk.support:SUPPORT_AGENT", tools=(LOOKUP, REFUND, EMAIL))
    assert whole.sdk_agent() is SUPPORT_AGENT and whole.agent_name == "support"


def test_an_agent_path_without_its_attribute_is_refused_at_registration():
    with pytest.raises(ValueError, match="no 'module:attribute'"):
        AgentRun("agent", agent="workflows.sdk.support", tools=(LOOKUP,))


def test_a_process_that_runs_no_agent_never_imports_the_sdk():
    """The web and the workers load every task type at start-up; the SDK (and the OpenAI client
    under it) only when a run needs its agent: tens of megabytes and seconds per process."""
    script = (
        "import sys, django; django.setup();"
        "from tasks import registry;"
        "assert 'support_agent' in registry.names();"
        "print(sorted(m for m in ('agents', 'openai') if m in sys.modules));"
        "registry.get('support_agent').step_as('agent', registry.AgentRun).sdk_agent();"
        "print(sorted(m for m in ('agents', 'openai') if m in sys.modules))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "DEBUG": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "['agents', 'openai']"]


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
