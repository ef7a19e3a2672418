"""How long to wait before trying again: one capped exponential formula for every retry.

A task type's retry waits (``TaskType.backoff_for``), the resends of an effect
found absent (``runtime.reconcile.resend_backoff``) and a worker's reconnects
to the database (``runtime.reconnect.Backoff``) all double a base delay per try
and never wait longer than a cap. Each caller adds its own jitter (or none) to
what ``capped_backoff`` returns: a task's retry deadline is exact, many resends or
reconnects that failed together are spread out.
"""

from __future__ import annotations

# 2.0 ** 1023 is the largest power of two a float holds: past it the product is inf (then the cap),
# never an OverflowError, however many tries a long-running loop has counted.
_MAX_DOUBLINGS = 1023


def capped_backoff(base: float, doublings: int, cap: float) -> float:
    """``base`` doubled ``doublings`` times (none when negative), at most ``cap``: seconds."""
    return min(cap, base * 2.0 ** min(max(doublings, 0), _MAX_DOUBLINGS))
