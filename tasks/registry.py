"""Task types: what a tenant may start, and what input each one accepts.

A task type names its input model (pydantic, ``extra="forbid"``), the step
its workflow starts at and the runtime configuration (model, prompt, tool set)
new tasks of the type are approved to run with.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ShortText = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RefundRequestInput(_Input):
    order_id: ShortText
    customer_email: Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+$", max_length=254)]
    amount: Decimal = Field(gt=0, max_digits=12, decimal_places=2)
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = "USD"
    reason: Annotated[str, StringConstraints(max_length=2000)] = ""


class OrderLookupInput(_Input):
    order_id: ShortText


@dataclass(frozen=True)
class TaskType:
    name: str
    description: str
    input_model: type[BaseModel]
    first_step: str
    model_id: str = "scripted-v1"
    prompt_id: str = ""
    toolset_id: str = ""


_REGISTRY: dict[str, TaskType] = {}


def register(task_type: TaskType) -> TaskType:
    if task_type.name in _REGISTRY:
        raise ValueError(f"task type {task_type.name!r} is already registered")
    _REGISTRY[task_type.name] = task_type
    return task_type


def get(name: str) -> TaskType:
    return _REGISTRY[name]


def names() -> list[str]:
    return sorted(_REGISTRY)


register(
    TaskType(
        name="refund_request",
        description="Gather evidence, ask the customer, wait for the return shipment, get approval, refund.",
        input_model=RefundRequestInput,
        first_step="gather_evidence",
        prompt_id="refund-triage@1",
        toolset_id="payments+tickets@1",
    )
)
register(
    TaskType(
        name="order_lookup",
        description="Look an order up in the order system, retrying while it is unavailable.",
        input_model=OrderLookupInput,
        first_step="lookup",
        prompt_id="order-lookup@1",
        toolset_id="orders@1",
    )
)
