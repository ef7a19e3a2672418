"""refund_request: read the order, ask the customer, await the return, then a ticket,
an approved refund and a notice — every kind of wait, an approval, three side effects
and a compensation (closing the ticket of a refund the payments system refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ledger.policy import CurrencyLimit, MoneyPolicy
from tasks.registry import (
    AwaitExternal,
    Complete,
    Dispatch,
    Fail,
    ModelTurn,
    ReadEvidence,
    RequestApproval,
    RequestInput,
    ShortText,
    TaskType,
    register,
)


class RefundRequestInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: ShortText
    customer_email: Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)]
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2)
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    reason: Annotated[str, StringConstraints(max_length=2000)] = ""


# Refunds always need an approver (``approve``); the policy adds to what the request shows: an amount
# above its currency's limit, a running total, or the order refunded already by another task.
MONEY = MoneyPolicy(
    limits={
        code: CurrencyLimit(each=Decimal("500"), total=Decimal("2500")) for code in ("USD", "EUR", "GBP")
    },
    reference="order_id",
    reference_kind="order",
    verb="refunded",
    always=True,
)


def triage(facts: Mapping[str, Any]) -> str:
    """The scripted model's triage: refund what the order supports; anything else goes to a person."""
    delivered = facts.get("order_status") == "delivered"
    within = float(facts.get("amount") or 0) <= float(facts.get("order_total") or 0)
    return "refund" if delivered and within else "escalate"


register(
    TaskType(
        name="refund_request",
        description="Read the order, ask the customer, await the return, open a ticket, refund, notify.",
        input_model=RefundRequestInput,
        prompt_id="refund-triage@1",
        toolset_id="orders+payments@1",
        replan_step="gather_evidence",
        scripts={"refund-triage@1": triage},
        material_facts={"order_total": "invalidate", "order_status": "refresh", "triage": "immaterial"},
        # The card the refund goes to, the customer's address and what they wrote: sealed at rest,
        # masked in the console and the API, never shown to the model (triage needs none of them).
        sensitive=frozenset({"refund_card", "customer_email", "reason", "damaged_item"}),
        # Resumed from a checkpoint (tasks.forks), the amount may be corrected; the rest stays as asked.
        fork_editable=frozenset({"amount"}),
        steps=(
            ReadEvidence(
                "gather_evidence",
                next="triage",
                system="orders",
                record_from="order_id",
                facts={"status": "order_status", "total": "order_total", "card": "refund_card"},
            ),
            ModelTurn(
                "triage",
                next="ask_customer",
                prompt_id="refund-triage@1",
                output="triage",
                instructions="Decide whether this refund can proceed: answer 'refund' or 'escalate'.",
                routes={"refund": "ask_customer", "escalate": "manual_review"},
            ),
            RequestInput(
                "ask_customer",
                next="await_return",
                question="Which item was damaged?",
                answer="damaged_item",
            ),
            AwaitExternal(
                "await_return",
                next="approve",
                event_type="shipment.returned",
                fact="return_tracking",
                value="tracking_number",
            ),
            RequestApproval(
                "approve",
                next="open_ticket",
                action_step="pay_refund",
                on_rejected="approval_rejected",
                reason="Refunds are paid only with an approver's consent (policy: refunds need four eyes).",
            ),
            Dispatch(
                "open_ticket",
                next="pay_refund",
                connector="tickets",
                output="ticket_ref",
                sensitive=frozenset({"customer"}),
                effect=lambda f: {
                    "kind": "ticket.open",
                    "subject": f"Refund for order {f['order_id']}",
                    "customer": f["customer_email"],
                },
            ),
            Dispatch(
                "pay_refund",
                next="notify",
                connector="payments",
                output="payment_ref",
                on_rejected="close_ticket",
                approval="approve",
                money=MONEY,
                sensitive=frozenset({"card"}),
                effect=lambda f: {
                    "kind": "refund",
                    "order_id": f["order_id"],
                    "amount": f["amount"],
                    "currency": f["currency"],
                    "card": f.get("refund_card"),
                },
            ),
            Dispatch(
                "notify",
                next="done",
                connector="email",
                output="email_ref",
                sensitive=frozenset({"to"}),
                effect=lambda f: {
                    "kind": "email",
                    "to": f["customer_email"],
                    "template": "refund_paid",
                    "order_id": f["order_id"],
                },
            ),
            Complete(
                "done", outcome=("order_id", "amount", "damaged_item", "return_tracking", "payment_ref")
            ),
            Dispatch(
                "close_ticket",
                next="refund_declined",
                connector="tickets",
                output="ticket_closed_ref",
                compensates="open_ticket",
                effect=lambda f: {
                    "kind": "ticket.close",
                    "ticket": f["ticket_ref"],
                    "reason": "refund declined",
                },
            ),
            Fail("refund_declined", reason="refund_rejected_by_payments"),
            Fail("manual_review", reason="refund_needs_manual_review"),
            Fail("approval_rejected", reason="refund_rejected_by_approver"),
        ),
    )
)
