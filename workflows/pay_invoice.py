"""pay_invoice: pay one invoice — the smallest task with a side effect.

Money policy: a payment above ``APPROVAL_ABOVE`` waits for an approver before
its intent is committed; at or below it, it is paid directly. The limit is in
the invoice's own currency (see ``tasks.registry.Dispatch.above_threshold``).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tasks.registry import Complete, Dispatch, Fail, RequestApproval, ShortText, TaskType, register

# Above this amount one operator (or integrator) token cannot move money alone.
APPROVAL_ABOVE = Decimal("1000")


class PayInvoiceInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    invoice_id: ShortText
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2)
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"


register(
    TaskType(
        name="pay_invoice",
        description="Pay one invoice: the smallest task with a side effect.",
        input_model=PayInvoiceInput,
        toolset_id="payments@1",
        steps=(
            Dispatch(
                "pay",
                next="done",
                connector="payments",
                output="payment_ref",
                approval="approve",
                approval_above={"amount": APPROVAL_ABOVE},
                effect=lambda f: {
                    "kind": "charge",
                    "invoice": f["invoice_id"],
                    "amount": f["amount"],
                    "currency": f["currency"],
                },
            ),
            Complete("done", outcome=("invoice_id", "amount", "payment_ref")),
            # Reached only from "pay", when the amount is above the threshold.
            RequestApproval(
                "approve",
                next="pay",
                action_step="pay",
                on_rejected="approval_rejected",
                reason=f"Payments above {APPROVAL_ABOVE:,f} need an approver's consent (money threshold).",
            ),
            Fail("approval_rejected", reason="payment_rejected_by_approver"),
        ),
    )
)
