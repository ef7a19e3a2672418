"""What model turns cost: one ``ModelUsage`` row per turn the endpoint counted, priced on the way in.

A turn's usage commits with the transition that follows the turn, inside its one transaction
(``recorder`` gives the ``also`` write the engine hands to ``advance``), so the task's figures
are exactly its rows: a turn whose transition was refused (a stale version, a lost lease) or
never ran (a crash) is not counted, a turn retried later is counted again as the new turn it is.
The counters (``tasks.metrics.model_used``) move only after that commit.

Which turns leave a row:

- an answer the task kept: ``committed``;
- an answer refused by ``llm.accepted`` (``ModelOutputInvalid``): the endpoint billed it, so it is
  recorded, not committed, when the endpoint counted its tokens;
- a turn that raised before answering (a timeout, an error) or was canceled (its answer thrown
  away before any transition): nothing reports usage, nothing is recorded; its span still carries
  whatever counts the endpoint gave.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal

from django.conf import settings

from runtime.llm import Reply
from runtime.models import ModelUsage
from tasks import metrics
from tasks.models import Task
from tasks.transitions import Append

PER_TOKENS = Decimal(1_000_000)  # MODEL_PRICES are per this many tokens


def cost(model_id: str, input_tokens: int | None, output_tokens: int | None) -> Decimal | None:
    """``tokens × price`` for ``model_id`` from ``settings.MODEL_PRICES``; None when the model has
    no price or either count is unknown (unpriced: never a 0 that reads as free)."""
    prices: dict[str, tuple[Decimal, Decimal]] = settings.MODEL_PRICES
    price = prices.get(model_id)
    if price is None or input_tokens is None or output_tokens is None:
        return None
    return (input_tokens * price[0] + output_tokens * price[1]) / PER_TOKENS


def reported(reply: Reply) -> bool:
    """Whether the endpoint counted any of ``reply``'s tokens."""
    return reply.input_tokens is not None or reply.output_tokens is not None


def recorder(task: Task, step: str, reply: Reply, *, committed: bool, now: datetime) -> Callable[[], None]:
    """The write that records ``reply``'s usage for ``task``'s turn at its current version, to run
    inside the transition leaving that version (``advance(also=...)``)."""
    usage = ModelUsage(
        task_id=task.id,
        step=step,
        state_version=task.state_version,
        attempt=task.attempt,
        model_id=reply.model_id[:128],
        input_tokens=reply.input_tokens,
        output_tokens=reply.output_tokens,
        cost=cost(reply.model_id, reply.input_tokens, reply.output_tokens),
        committed=committed,
        recorded_at=now,
    )
    # An ``Append``: on PostgreSQL the row rides on the transition's own statement.
    counted = functools.partial(
        metrics.model_used, usage.model_id, usage.input_tokens, usage.output_tokens, usage.cost
    )
    return Append(usage, committed=counted)
