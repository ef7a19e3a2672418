"""The money policy a Dispatch declares (``tasks.registry.Dispatch.money``): pure data, no I/O.

Imported by the registry while the apps load, so nothing here touches a model; what the policy
is checked against (the ledger's movements) is ``ledger.money``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal


@dataclass(frozen=True)
class CurrencyLimit:
    each: Decimal  # one effect above this needs an approval
    total: Decimal  # a requester's (or a token's) effects in the window above this need one


@dataclass(frozen=True)
class MoneyPolicy:
    limits: Mapping[str, CurrencyLimit]
    window: timedelta = timedelta(days=1)
    amount: str = "amount"  # the fact holding the amount
    currency: str = "currency"  # the fact holding the ISO code
    reference: str = ""  # the fact holding the business reference ("" = none declared)
    reference_kind: str = ""  # what the reference names ("invoice"), shown and stored with it
    verb: str = "paid"  # what an earlier effect did to it ("invoice INV-7 was paid …")
    on_duplicate: Literal["approve", "refuse"] = "approve"
    # Every effect needs the approval (a refund); what the policy finds is shown on the request.
    always: bool = False

    def __post_init__(self) -> None:
        if self.reference and not self.reference_kind:
            raise ValueError("a money policy's reference needs a reference_kind to name it")
        for currency, limit in self.limits.items():
            if limit.total < limit.each:
                raise ValueError(f"{currency}: a running total limit below the per-effect limit")

    def money(self, facts: Mapping[str, Any]) -> tuple[Decimal | None, str]:
        """(amount, currency) from the facts; amount None when it is not a finite number."""
        return _decimal(facts.get(self.amount)), str(facts.get(self.currency) or "")

    def reference_of(self, facts: Mapping[str, Any]) -> str:
        value = facts.get(self.reference) if self.reference else None
        return f"{self.reference_kind}:{value}" if value not in (None, "") else ""

    def over_limit(self, facts: Mapping[str, Any]) -> list[str]:
        """Why this one effect needs an approval by the table alone (no ledger read), one line each.

        Fails closed: an amount that is missing or not a finite number, and a currency the table
        does not name, need an approval — "we could not tell how much" must not mean "no approval".
        """
        amount, currency = self.money(facts)
        if amount is None:
            return [f"{self.amount} {facts.get(self.amount)!r} is not an amount the limits can be checked on"]
        if amount <= 0:  # a model's arguments are not an input form: "below every limit" is no pass
            return [f"{self.amount} {shown(amount)} is not a positive amount"]
        limit = self.limits.get(currency)
        if limit is None:
            code = currency or "no currency"
            return [
                f"{shown(amount)} {code}: {code} has no limit in this task type's table, so it needs approval"
            ]
        if amount > limit.each:
            return [f"{shown(amount)} {currency} is above {currency}'s limit of {limit.each:,f}"]
        return []


def _decimal(value: Any) -> Decimal | None:
    """``value`` as a finite Decimal (facts hold amounts as text), or None when it is not one."""
    if value is None or isinstance(value, bool):
        return None
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        return None
    return amount if amount.is_finite() else None


def shown(amount: Decimal) -> str:
    """An amount as people read it: thousands grouped, at least two decimals, no trailing zeros beyond
    (the ledger keeps eight places; 500.00000000 is shown 500.00, 250.125 as 250.125)."""
    places = min(amount.normalize().as_tuple().exponent, -2)
    assert isinstance(places, int)  # a finite amount (the policy refuses any other)
    return f"{amount.quantize(Decimal(1).scaleb(places)):,f}"
