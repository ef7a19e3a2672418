"""The only writer of an action's dispatch state (after the intent was committed).

Every write is one guarded UPDATE. Two guards may ride on it besides the
source state:

- ``attempts``: the send count the writer saw. Each claim bumps it, so an
  answer about an earlier send (a slow worker, a slow lookup) can never
  settle a later one that happens to be in the same state (no ABA).
- ``fence``: a condition checked in the same statement — for a worker, that
  its lease is still the task's lease (``tasks.leases.fence``: the same fencing
  token the transition primitive checks), so a worker that was paused while
  another took its task over cannot claim, send or record anything.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, F, Q
from django.utils import timezone

from audit.redaction import redact
from ledger.models import DISPATCH_MOVES, Action, DispatchState


def action_move(
    action_id: int,
    source: str,
    target: str,
    *,
    attempts: int | None = None,
    fence: Exists | Q | None = None,
    **fields: Any,
) -> bool:
    """Compare-and-set ``dispatch_state`` from ``source`` to ``target``; False if it moved meanwhile
    (or, with ``attempts``, was sent again since; or, with ``fence``, the lease is no longer held).

    Raises ``ValueError`` for a move the ledger's table does not allow.
    """
    if target not in DISPATCH_MOVES.get(source, frozenset()):
        raise ValueError(f"an action cannot go from {source} to {target}")
    now = timezone.now()
    if target == DispatchState.DISPATCHING:
        fields["attempts"] = F("attempts") + 1
        fields.setdefault("dispatched_at", now)
    if target == DispatchState.UNKNOWN:
        fields.setdefault("unknown_since", now)
    if target not in (DispatchState.DISPATCHING, DispatchState.UNKNOWN):
        fields.setdefault("resolved_at", now)
    if isinstance(fields.get("last_error"), str):
        fields["last_error"] = redact(fields["last_error"])  # whatever connector raised it
    rows = Action.objects.filter(pk=action_id, dispatch_state=source)
    if attempts is not None:
        rows = rows.filter(attempts=attempts)
    if fence is not None:
        rows = rows.filter(fence)
    return rows.update(dispatch_state=target, updated_at=now, **fields) == 1
