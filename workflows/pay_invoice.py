"""pay_invoice: pay one invoice — the smallest task with a side effect."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from tasks.registry import Complete, Dispatch, ShortText, TaskType, register


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
                effect=lambda f: {
                    "kind": "charge",
                    "invoice": f["invoice_id"],
                    "amount": f["amount"],
                    "currency": f["currency"],
                },
            ),
            Complete("done", outcome=("invoice_id", "amount", "payment_ref")),
        ),
    )
)
