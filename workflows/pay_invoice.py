"""pay_invoice: pay one invoice — the smallest task with a side effect.

Money policy (``MONEY``, see ``ledger.money``): a payment waits for an approver
before its intent is committed when it is above its currency's limit (or in a
currency the table does not name), when it brings its requester's or its API
token's payments of the last 24 hours above the currency's running limit, or
when the invoice was already paid (or is being paid) by another task — the
approval request shows that payment. Otherwise it is paid directly.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ledger.policy import CurrencyLimit, MoneyPolicy
from tasks.registry import Complete, Dispatch, Fail, RequestApproval, ShortText, TaskType, register


def _limit(each: str) -> CurrencyLimit:
    # A requester (or one API token) moves at most five such payments a day without an approver.
    return CurrencyLimit(each=Decimal(each), total=Decimal(each) * 5)


# Per currency, in its own units: above ``each`` one operator (or integrator) token cannot move money
# alone. A currency not listed here (XAU, a typo, a new one) always needs an approver.
LIMITS = {
    "USD": _limit("1000"),
    "EUR": _limit("1000"),
    "GBP": _limit("800"),
    "CHF": _limit("1000"),
    "JPY": _limit("150000"),
    "KWD": _limit("250"),
}
MONEY = MoneyPolicy(limits=LIMITS, reference="invoice_id", reference_kind="invoice", verb="paid")


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
        # Resumed from a checkpoint (tasks.forks), the amount may be corrected; the invoice stays.
        fork_editable=frozenset({"amount"}),
        steps=(
            Dispatch(
                "pay",
                next="done",
                connector="payments",
                output="payment_ref",
                approval="approve",
                money=MONEY,
                effect=lambda f: {
                    "kind": "charge",
                    "invoice": f["invoice_id"],
                    "amount": f["amount"],
                    "currency": f["currency"],
                },
            ),
            Complete("done", outcome=("invoice_id", "amount", "payment_ref")),
            # Reached only from "pay", when the money policy finds something to ask about.
            RequestApproval(
                "approve",
                next="pay",
                action_step="pay",
                on_rejected="approval_rejected",
                reason="This payment needs an approver's consent under the money policy:",
            ),
            Fail("approval_rejected", reason="payment_rejected_by_approver"),
        ),
    )
)
