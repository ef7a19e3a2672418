"""order_batch: look several orders up at once, each as a child ``order_lookup`` task, then report.

The smallest parent: it starts one child per order, waits in ``waiting_children``
until every child has ended, and reports how many completed. Canceling it
cancels the children still running; a child that did not complete is counted,
not hidden.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tasks.registry import Complete, ModelTurn, ShortText, StartChildren, TaskType, register

MAX_ORDERS = 20


class OrderBatchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_ids: list[ShortText] = Field(min_length=1, max_length=MAX_ORDERS)


def initial_facts(accepted: Mapping[str, Any]) -> dict[str, Any]:
    ids = [str(order_id) for order_id in accepted["order_ids"]]
    return {"order_ids": ",".join(ids), "orders": len(ids)}


def lookups(facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "task_type": "order_lookup",
            "objective": f"look order {order_id} up",
            "input": {"order_id": order_id},
        }
        for order_id in str(facts["order_ids"]).split(",")
    ]


def report(facts: Mapping[str, Any]) -> str:
    """The scripted model's report."""
    return f"{facts.get('lookups_completed', 0)} of {facts.get('orders', 0)} orders looked up"


register(
    TaskType(
        name="order_batch",
        description="Look several orders up, each as a child task, and report how many were found.",
        input_model=OrderBatchInput,
        initial_facts=initial_facts,
        prompt_id="order-batch@1",
        toolset_id="orders@1",
        scripts={"order-batch@1": report},
        steps=(
            StartChildren(
                "lookups",
                next="report",
                on_incomplete="report",
                children=lookups,
                output="lookups",
                timeout=timedelta(hours=1),
            ),  # fmt: skip
            ModelTurn(
                "report",
                next="done",
                prompt_id="order-batch@1",
                output="summary",
                instructions="Say how many of the orders were looked up.",
            ),
            Complete("done", outcome=("orders", "lookups_completed", "lookups_not_completed", "summary")),
        ),
    )
)
