"""support_agent: a customer-support agent written with the OpenAI Agents SDK, run durably.

The agent looks the order up (evidence), refunds it (a ledger action; an approver's consent above
100 in the order's currency, or for an order refunded before) and e-mails the customer (a ledger
action). Its model is ``SupportModel``, a deterministic SDK ``Model`` (the demo's and the tests';
no network); with ``MODEL_BACKEND=openai`` the same agent runs on any OpenAI-compatible server
(``runtime.sdk.replay``). The tools' bodies never run: the runtime performs each call through the
ledger or the evidence reader, as its declaration in the task type says.
"""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from agents import Agent, Model, ModelResponse, Usage, function_tool
from django.conf import settings
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
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

INSTRUCTIONS = (
    "You resolve refund requests. Look the order up first. Refund only a delivered order, and never more"
    " than its total; then e-mail the customer that the refund was paid. If the refund is rejected, say so"
    " and stop. Answer with one sentence for the support log."
)


@function_tool
def lookup_order(order_id: str) -> str:
    """Look an order up: its status and total."""
    raise NotImplementedError("performed by the runtime: evidence from the order system")


@function_tool
def refund_order(order_id: str, amount: str, currency: str) -> str:
    """Refund part or all of an order to the card it was paid with."""
    raise NotImplementedError("performed by the runtime: a ledger action through payments")


@function_tool
def email_customer(order_id: str, template: str) -> str:
    """E-mail the order's customer one of the support templates (refund_paid, refund_declined)."""
    raise NotImplementedError("performed by the runtime: a ledger action through email")


class SupportModel(Model):
    """The support agent's deterministic model: reads the conversation, answers as the instructions say.

    Counts tokens as a rough tokenizer would (a token per four characters), so usage and cost show
    without an endpoint. ``latency`` seconds per answer stand in for a real model's turn."""

    model_id = "scripted-support-v1"

    def __init__(self, latency: float | None = None) -> None:
        self.latency = latency  # None: MODEL_LATENCY_MS, read at each turn (as the scripted model does)

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        latency = settings.MODEL_LATENCY_MS / 1000 if self.latency is None else self.latency
        if latency:
            await asyncio.sleep(latency)
        items = [input] if isinstance(input, str) else list(input)
        answer = _next_move(items)
        shown = json.dumps(items, default=str) + str(system_instructions or "")
        return ModelResponse(
            output=answer,
            usage=Usage(
                requests=1,
                input_tokens=_tokens(shown),
                output_tokens=_tokens(json.dumps([a.model_dump() for a in answer], default=str)),
                total_tokens=_tokens(shown)
                + _tokens(json.dumps([a.model_dump() for a in answer], default=str)),
            ),
            response_id=None,
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the support model does not stream")


def _tokens(text: str) -> int:
    return max(1, -(-len(text) // 4))


def _next_move(conversation: list[Any]) -> list[Any]:
    """The next move from the conversation so far: which tool to call, or the final sentence. Only
    this request counts (what follows the last user message); earlier ones are memory."""
    asks = [n for n, i in enumerate(conversation) if isinstance(i, dict) and i.get("role") == "user"]
    items = conversation[asks[-1] :] if asks else conversation
    brief = _brief(items)
    calls = {
        i["call_id"]: i["name"] for i in items if isinstance(i, dict) and i.get("type") == "function_call"
    }
    results = {
        calls.get(i["call_id"], ""): str(i.get("output", ""))
        for i in items
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }
    # Call ids unique over the whole conversation (memory holds earlier requests' calls).
    turn = sum(1 for i in conversation if isinstance(i, dict) and i.get("type") == "function_call") + 1
    order = str(brief.get("order_id", ""))
    if "lookup_order" not in results:
        return [_call(turn, "lookup_order", {"order_id": order})]
    looked = _json(results["lookup_order"])
    amount, total = _decimal(brief.get("amount")), _decimal(looked.get("order_total"))
    if "refund_order" not in results:
        if looked.get("order_status") != "delivered" or amount is None or total is None or amount > total:
            return [_say(f"Order {order} cannot be refunded as asked: it goes to a person.")]
        money = {
            "order_id": order,
            "amount": str(brief.get("amount")),
            "currency": brief.get("currency", "USD"),
        }
        return [_call(turn, "refund_order", money)]
    refunded = _json(results["refund_order"])
    if not refunded.get("ok"):
        why = "an approver rejected it" if "approver" in results["refund_order"] else "payments refused it"
        return [_say(f"The refund of order {order} was not paid: {why}.")]
    if "email_customer" not in results:
        return [_call(turn, "email_customer", {"order_id": order, "template": "refund_paid"})]
    again = " They have asked before." if len(asks) > 1 else ""
    return [
        _say(
            f"Refunded {brief.get('amount')} {brief.get('currency', 'USD')} for order {order}"
            f" (payment {refunded.get('reference')}); the customer was e-mailed.{again}"
        )
    ]


def _brief(items: list[Any]) -> dict[str, Any]:
    for item in items:
        text = item if isinstance(item, str) else item.get("content") if isinstance(item, dict) else None
        if isinstance(text, str) and (item is text or item.get("role") == "user"):
            parsed = _json(text)
            if parsed:
                return parsed
    return {}


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _decimal(value: Any) -> Decimal | None:
    try:
        return Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None


def _call(turn: int, name: str, arguments: dict[str, Any]) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", call_id=f"call_{turn}_{name}", name=name, arguments=json.dumps(arguments)
    )


def _say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        type="message",
        id="msg_final",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


SUPPORT_AGENT = Agent(
    name="support",
    instructions=INSTRUCTIONS,
    tools=[lookup_order, refund_order, email_customer],
    model=SupportModel(),
)


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
        model_id=SupportModel.model_id,
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
                agent=SUPPORT_AGENT,
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
