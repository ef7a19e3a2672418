"""A task whose audit chain is broken: shown on its task page, and acted on only once confirmed.

The check is the audit history's integrity badge (``console.audit.integrity``: ``verify_audit``'s
check, hashing only the events after the task's verified-through mark). An operator acting on such a
task must tick a confirmation naming the break (``CONFIRM_FIELD``, whose value is where the chain
breaks: ``v3`` or ``head``); a control posted without it, or confirming another break than the one
there now, is refused with nothing changed. The refusal is here, in the view layer, before the one
service call each task-page post makes.
"""

from __future__ import annotations

from typing import Any

from audit.chain import BrokenLink
from console.audit import integrity

CONFIRM_FIELD = "confirm_broken_chain"


def broken_chain(task: Any) -> BrokenLink | None:
    """The first break of ``task``'s chain, or None: the audit history's badge."""
    return integrity(task)


def where(broken: BrokenLink) -> str:
    """Where the chain breaks, as the confirmation names it: ``v3``, or ``head``."""
    return f"v{broken.state_version}" if broken.state_version is not None else "head"


def refusal(task: Any, posted: Any) -> str | None:
    """Why a state-changing post on ``task`` is refused for its broken chain; None when it may go on."""
    broken = broken_chain(task)
    if broken is None or posted.get(CONFIRM_FIELD) == where(broken):
        return None
    return (
        f"Nothing changed: this task's audit chain is broken at {where(broken)} ({broken.problem}). "
        f"To act on it anyway, tick “I know this task's audit chain is broken at {where(broken)}” "
        "and send again."
    )
