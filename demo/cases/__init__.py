"""The demo's tasks, as one small module of cases per workflow (``workflows/<name>.py`` has
``demo/cases/<name>.py``); ``seed_demo`` seeds ``CASES`` in each tenant, in this order.

Each case starts one demo task (``demo-<key>``) and drives it through real
transitions to where the demo shows it (``seeding.Seeding``). None of the
standing ones resolves by itself while ``make demo`` runs; the module
docstrings say which are which.
"""

from __future__ import annotations

from demo.cases import order_batch, order_lookup, pay_invoice, refund_request, support_agent
from demo.cases.seeding import Case

CASES: tuple[Case, ...] = (
    *refund_request.CASES,
    *order_lookup.CASES,
    *order_batch.CASES,
    *pay_invoice.CASES,
    *support_agent.CASES,
)
