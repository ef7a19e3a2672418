"""Demo cases of ``support_agent`` (an OpenAI Agents SDK agent): a small refund the workers run to its
end, and one above the refund limit that they run to its pause, where it waits for an approver.

Nothing is recorded for them by hand: the agent's turns, its calls and its pause are what the
running workers write (``run_demo``), the sandbox's order system answering its look-ups. The type
is registered only where the SDK is installed (the ``agents`` extra); elsewhere these cases seed
nothing.
"""

from __future__ import annotations

from demo.cases.seeding import Case, Seeding
from tasks import registry

TASK_TYPE = "support_agent"


def _start(seeding: Seeding, key: str, order: str, amount: str, message: str) -> None:
    if TASK_TYPE not in registry.names():
        return
    seeding.start(
        key,
        TASK_TYPE,
        f"Customer asks for {amount} USD back on order {order}",
        {
            "order_id": order,
            "customer_email": f"customer-{order.lower()}@example.com",
            "amount": amount,
            "currency": "USD",
            "message": message,
        },
    )


def small_refund(seeding: Seeding) -> None:
    """Under the 100 USD limit: looked up, refunded and e-mailed without asking anyone."""
    _start(seeding, "agent-refund", "A-118", "20.00", "The lid was cracked; a partial refund is fine.")


def refund_for_approval(seeding: Seeding) -> None:
    """150 USD, above the limit: the agent's refund_order call waits for an approver's consent."""
    _start(seeding, "agent-approval", "A-119", "150.00", "Half of the set arrived broken.")


CASES: tuple[Case, ...] = (small_refund, refund_for_approval)
