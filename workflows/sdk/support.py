"""The support agent itself (``workflows.support_agent`` declares its task type): its tools, its
deterministic model and the ``Agent``. Only this module imports the Agents SDK, and only a run of the
agent imports this module."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal, InvalidOperation
from typing import Any

from agents import Agent, Model, ModelResponse, Usage, function_tool
from django.conf import settings
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from workflows.support_agent import MODEL_ID

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

    model_id = MODEL_ID

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
