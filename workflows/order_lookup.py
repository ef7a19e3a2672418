"""order_lookup: look an order up in the order system (retrying while it is unavailable)
and summarize it — the smallest task with evidence and a model turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from tasks.registry import Complete, ModelTurn, ReadEvidence, ShortText, TaskType, register


class OrderLookupInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_id: ShortText


def summarize(facts: Mapping[str, Any]) -> str:
    """The scripted model's one-sentence summary."""
    return f"order {facts.get('order_id')} is {facts.get('order_status', 'unknown')}"


register(
    TaskType(
        name="order_lookup",
        description="Look an order up in the order system, retrying while it is unavailable.",
        input_model=OrderLookupInput,
        prompt_id="order-lookup@1",
        toolset_id="orders@1",
        replan_step="lookup",
        scripts={"order-lookup@1": summarize},
        max_attempts=4,
        backoff=timedelta(seconds=2),
        steps=(
            ReadEvidence(
                "lookup",
                next="summarize",
                system="orders",
                record_from="order_id",
                facts={"status": "order_status"},
            ),
            ModelTurn(
                "summarize",
                next="done",
                prompt_id="order-lookup@1",
                output="summary",
                instructions="Summarize the order's status in one sentence.",
            ),
            Complete("done", outcome=("order_id", "order_status", "summary")),
        ),
    )
)
