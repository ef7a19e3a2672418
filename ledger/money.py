"""The money policy a Dispatch declares, and the ledger's facts it is checked against.

A Dispatch that moves money declares a ``MoneyPolicy`` (``ledger.policy``, the declaration;
``tasks.registry.Dispatch.money``):

- ``limits``, one table per currency: the most one effect may move without an approval
  (``each``), and the most one requester — and, apart, one API token — may move through
  effects of this type within ``window`` (``total``), counting what succeeded or is still in
  flight, this one included. Amounts are compared in the currency's own units: there is no
  exchange rate (a rate that moves would unbind an approval), so a currency missing from the
  table needs an approval whatever the amount.
- ``reference``: the fact holding the business reference the effect pays (the invoice id),
  kept as ``<reference_kind>:<value>``. Another effect for the same reference in the tenant,
  succeeded or in flight, sends this one to an approval that shows the earlier one
  (``on_duplicate="approve"``) or refuses it (``"refuse"``).

``review`` runs the checks for one effect about to be intended; each finding is a sentence the
approval request shows. ``guard`` runs them again inside the intent's own transaction, under
advisory locks on the requester, the token and the reference, so two intents racing each other
cannot both pass on a total or a reference that neither has seen yet.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from django.db import connection
from django.db.models import QuerySet, Sum
from django.utils import timezone

from ledger.models import IN_DOUBT, SENDABLE, SETTLED_OK, MoneyMovement
from ledger.policy import MoneyPolicy, shown

# What a running total and a duplicate reference count: effects that succeeded, or may yet.
COUNTED = SETTLED_OK | IN_DOUBT | SENDABLE


class PolicyMoved(Exception):
    """Inside an intent's transaction: another effect committed since the review, and the intent no
    longer passes (raised from ``guard``; the caller's transition then commits nothing)."""


@dataclass(frozen=True)
class Spender:
    """Who an effect moves money for: the task's tenant, type, owner and the token that started it."""

    tenant_id: int
    task_type: str
    task_id: UUID
    requester: str  # "user:<name>", or "" for a task without an owner
    token_id: int | None
    token_label: str = ""
    # The step making the effect: "this one" is the task's effect of this step. An agent's run makes
    # one effect per tool call, each a step of its own, so its earlier calls count like other tasks'.
    # "": the task's every effect is "this one" (a workflow's task makes one).
    step: str = ""


def spender(task: Any, step: str = "") -> Spender:
    """The ``Spender`` of a ``tasks.Task`` (taken by its fields: the ledger sits below the kernel)
    for the effect of its step ``step``."""
    token = task.api_token if task.api_token_id else None
    return Spender(
        tenant_id=task.tenant_id,
        task_type=task.task_type,
        task_id=task.id,
        step=step,
        requester=f"user:{task.owner.get_username()}" if task.owner_id else "",
        token_id=task.api_token_id,
        token_label=f"token {token.prefix}…{f' ({token.name})' if token.name else ''}" if token else "",
    )


@dataclass(frozen=True)
class Finding:
    code: str  # money_limit, money_running_total, duplicate_reference
    why: str  # the sentence the approval request (or the refusal) shows
    earlier: tuple[MoneyMovement, ...] = ()


@dataclass(frozen=True)
class Review:
    findings: tuple[Finding, ...] = ()
    refused: Finding | None = None  # a duplicate reference under on_duplicate="refuse"
    # How the declared limits stand where nothing was found (a running total below its limit): shown on
    # a request asked for another reason, so the approver sees every declared check.
    notes: tuple[str, ...] = ()

    @property
    def reasons(self) -> list[str]:
        return [finding.why for finding in self.findings]


def counted(tenant_id: int) -> QuerySet[MoneyMovement]:
    """A tenant's movements that succeeded or are in flight."""
    return MoneyMovement.objects.filter(tenant_id=tenant_id, action__dispatch_state__in=COUNTED)


def running_total(
    who: Spender, currency: str, since: datetime, *, by: Literal["requester", "token"]
) -> Decimal:
    """The sum of ``who``'s counted movements of its type in ``currency`` since ``since``, by its
    requester or by its token; its own effect's movements are not counted (they are "this one",
    see ``Spender.step``). One range read on ``money_by_requester`` / ``money_by_token``."""
    rows = counted(who.tenant_id).filter(task_type=who.task_type, currency=currency, created_at__gte=since)
    rows = (
        rows.filter(requester=who.requester) if by == "requester" else rows.filter(api_token_id=who.token_id)
    )
    total = rows.exclude(**_this_one(who.task_id, who.step)).aggregate(total=Sum("amount"))["total"]
    return total or Decimal(0)


def _this_one(task_id: UUID, step: str) -> dict[str, Any]:
    return {"action__task_id": task_id, **({"action__step": step} if step else {})}


def earlier_movements(tenant_id: int, task_id: UUID, reference: str, step: str = "") -> list[MoneyMovement]:
    """Counted movements in the tenant for ``reference`` but those of ``task_id``'s effect (of its
    step ``step``; "": of any), oldest first (``money_by_reference``)."""
    rows = counted(tenant_id).filter(reference=reference).exclude(**_this_one(task_id, step))
    return list(rows.select_related("action").order_by("created_at")[:5])


def _span(window: timedelta) -> str:
    hours = int(window.total_seconds() // 3600)
    if hours and window.total_seconds() == hours * 3600:
        return f"the last {hours} hours" if hours != 1 else "the last hour"
    return f"the last {window}"


def describe(movement: MoneyMovement) -> str:
    """An earlier effect as the approval shows it: amount, when, by which task, how it stands."""
    action = movement.action
    amount = (
        f"{shown(movement.amount)} {movement.currency}" if movement.amount is not None else "an unread amount"
    )
    ref = f", external ref {action.external_ref}" if action.external_ref else ""
    return (
        f"{amount} on {movement.created_at:%Y-%m-%d %H:%M} UTC by task {action.task_id}"
        f" ({action.dispatch_state}{ref})"
    )


def review(policy: MoneyPolicy, facts: Mapping[str, Any], who: Spender, *, now: datetime) -> Review:
    """Everything ``policy`` finds about one effect built from ``facts`` for ``who``."""
    findings = [Finding("money_limit", why) for why in policy.over_limit(facts)]
    notes: list[str] = []
    amount, currency = policy.money(facts)
    limit = policy.limits.get(currency)
    if amount is not None and limit is not None:
        since = now - policy.window
        whom: list[tuple[Literal["requester", "token"], str]] = []
        if who.requester:
            whom.append(("requester", who.requester.removeprefix("user:")))
        if who.token_id is not None:
            whom.append(("token", who.token_label or f"token {who.token_id}"))
        for by, name in whom:
            total = running_total(who, currency, since, by=by) + amount
            so_far = f"running total for {name} over {_span(policy.window)}: {shown(total)} {currency}"
            if total > limit.total:
                why = f"{so_far} with this one, above the limit of {limit.total:,f} {currency}"
                findings.append(Finding("money_running_total", why))
            else:
                notes.append(f"{so_far} of {limit.total:,f} {currency} with this one")
    refused = None
    reference = policy.reference_of(facts)
    earlier = earlier_movements(who.tenant_id, who.task_id, reference, who.step) if reference else []
    if earlier:
        named = reference.replace(":", " ", 1)
        found = Finding(
            "duplicate_reference",
            f"{named} was already {policy.verb}: " + "; ".join(describe(m) for m in earlier),
            tuple(earlier),
        )
        if policy.on_duplicate == "refuse":
            refused = found
        else:
            findings.append(found)
    return Review(tuple(findings), refused, tuple(notes))


def movement(
    policy: MoneyPolicy, facts: Mapping[str, Any], who: Spender, *, idempotency_key: str, now: datetime
) -> MoneyMovement:
    """The row an intent commits with (the same transition) so later reviews count it."""
    amount, currency = policy.money(facts)
    return MoneyMovement(
        action_id=idempotency_key,
        tenant_id=who.tenant_id,
        task_type=who.task_type,
        requester=who.requester,
        api_token_id=who.token_id,
        reference=policy.reference_of(facts),
        amount=amount,
        currency=currency[:16],
        created_at=now,
    )


def unseen(found: Review, asked_at: datetime) -> list[MoneyMovement]:
    """Earlier effects for the reference committed after ``asked_at``: an approval requested then
    could not show them (``request_decision`` reviewed when it asked), so it does not cover them."""
    duplicates = [f for f in (*found.findings, found.refused) if f is not None and f.earlier]
    return [m for f in duplicates for m in f.earlier if m.created_at > asked_at]


def guard(
    policy: MoneyPolicy, facts: Mapping[str, Any], who: Spender, *, approved_at: datetime | None
) -> Callable[[], None]:
    """A write for the intent's transaction: lock the requester, the token and the reference, then
    review again with every effect committed before; raise ``PolicyMoved`` when the intent no longer
    passes: refused now; without an approval (``approved_at`` None), anything found; with one asked
    at ``approved_at``, an effect for the same reference it did not show. Waiters on a lock see the
    first intent's row once it commits (READ COMMITTED reads anew per statement)."""
    return functools.partial(_guard, policy, dict(facts), who, approved_at)


def _guard(policy: MoneyPolicy, facts: dict[str, Any], who: Spender, approved_at: datetime | None) -> None:
    if connection.vendor == "postgresql":  # SQLite (the demo) has one writer at a time anyway
        reference = policy.reference_of(facts)
        keys = sorted(
            key
            for key in (
                f"money:{who.tenant_id}:{who.task_type}:{who.requester}" if who.requester else "",
                f"money:token:{who.token_id}:{who.task_type}" if who.token_id is not None else "",
                f"money:{who.tenant_id}:ref:{reference}" if reference else "",
            )
            if key
        )
        with connection.cursor() as cursor:
            for key in keys:  # in one order everywhere: two intents never wait on each other's second lock
                cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])
    again = review(policy, facts, who, now=timezone.now())
    if again.refused is not None:
        raise PolicyMoved(again.refused.why)
    if approved_at is None and again.findings:
        raise PolicyMoved("; ".join(again.reasons))
    late = unseen(again, approved_at) if approved_at is not None else []
    if late:
        raise PolicyMoved("made after the approval was asked: " + "; ".join(describe(m) for m in late))
