"""support_agent: a customer-support agent written with the OpenAI Agents SDK, run durably.

The agent looks the order up (evidence), refunds it (a ledger action; an approver's consent above
100 in the order's currency, or for an order refunded before) and e-mails the customer (a ledger
action). Its model is ``SupportModel``, a deterministic SDK ``Model`` (the demo's and the tests';
no network); with ``MODEL_BACKEND=openai`` the same agent runs on any OpenAI-compatible server
(``runtime.sdk.replay``). The tools' bodies never run: the runtime performs each call through the
ledger or the evidence reader, as its declaration in the task type says.

This module declares the task type and imports no SDK: the agent itself, its tools and its model
are ``workflows.sdk.support``, imported by the first run that needs them (``AgentRun.sdk_agent``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ledger.policy import CurrencyLimit, MoneyPolicy
from tasks.registry import (
    AgentEffect,
    AgentEvidence,
    AgentRun,
    Complete,
    EvidenceBinding,
    ShortText,
    TaskType,
    register,
)

# The support model's id (``workflows.sdk.support.SupportModel``), named here without importing it.
MODEL_ID = "scripted-support-v1"


class SupportAgentInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: ShortText
    customer_email: Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)]
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2)
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    message: Annotated[str, StringConstraints(max_length=2000)] = ""


# An approver above 100 per refund, or past 1,000 a day, or for an order refunded before.
REFUNDS = MoneyPolicy(
    limits={
        code: CurrencyLimit(each=Decimal("100"), total=Decimal("1000")) for code in ("USD", "EUR", "GBP")
    },
    reference="order_id",
    reference_kind="order",
    verb="refunded",
)


REFUND_BINDING = EvidenceBinding(
    evidence="lookup_order",
    record="order_id",
    at_most={"amount": "order_total"},
    equal={"currency": "order_currency"},
)


register(
    TaskType(
        name="support_agent",
        description="An SDK agent resolves a refund: looks the order up, refunds it, e-mails the customer.",
        input_model=SupportAgentInput,
        model_id=MODEL_ID,
        prompt_id="support-agent@1",
        toolset_id="lookup_order+refund_order+email_customer@1",
        replan_step="agent",
        material_facts={"order_total": "invalidate", "order_status": "invalidate"},
        # The customer's address, their message and the card: sealed, masked, never shown to the model.
        sensitive=frozenset({"customer_email", "message", "refund_card"}),
        steps=(
            AgentRun(
                "agent",
                next="done",
                agent="workflows.sdk.support:SUPPORT_AGENT",
                brief=("order_id", "amount", "currency"),
                output="answer",
                session="customer_email",  # one conversation per customer: earlier requests are memory
                tools=(
                    AgentEvidence(
                        "lookup_order",
                        system="orders",
                        record_from="order_id",
                        facts={
                            "status": "order_status",
                            "total": "order_total",
                            "currency": "order_currency",
                            "card": "refund_card",
                        },
                    ),
                    AgentEffect(
                        "refund_order",
                        connector="payments",
                        money=REFUNDS,
                        reason="Refunds above the limit need an approver's consent (four eyes).",
                        sensitive=frozenset({"card"}),
                        # The model names the order and the amount; the evidence decides: an order this
                        # task looked up (the last one), at most its total, in its currency, and the
                        # card is the one that order was paid with (a fact of it, never an argument).
                        binding=REFUND_BINDING,
                        effect=lambda args, facts: {
                            "kind": "refund",
                            "order_id": args.get("order_id"),
                            "amount": args.get("amount"),
                            "currency": args.get("currency"),
                            "card": facts.get("refund_card"),
                        },
                    ),
                    AgentEffect(
                        "email_customer",
                        connector="email",
                        sensitive=frozenset({"to"}),
                        effect=lambda args, facts: {
                            "kind": "email",
                            "to": facts.get("customer_email"),
                            "template": args.get("template"),
                            "order_id": args.get("order_id"),
                        },
                    ),
                ),
            ),
            Complete("done", outcome=("order_id", "answer")),
        ),
    )
)
