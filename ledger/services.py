"""The only writer of an action's dispatch state (after the intent was committed)."""

from __future__ import annotations

from typing import Any

from django.db.models import F
from django.utils import timezone

from ledger.models import DISPATCH_MOVES, Action, DispatchState


def action_move(action_id: int, source: str, target: str, **fields: Any) -> bool:
    """Compare-and-set ``dispatch_state`` from ``source`` to ``target``; False if it moved meanwhile.

    Raises ``ValueError`` for a move the ledger's table does not allow.
    """
    if target not in DISPATCH_MOVES.get(source, frozenset()):
        raise ValueError(f"an action cannot go from {source} to {target}")
    now = timezone.now()
    if target == DispatchState.DISPATCHING:
        fields["attempts"] = F("attempts") + 1
    if target == DispatchState.UNKNOWN:
        fields.setdefault("unknown_since", now)
    if target not in (DispatchState.DISPATCHING, DispatchState.UNKNOWN):
        fields.setdefault("resolved_at", now)
    updated = Action.objects.filter(pk=action_id, dispatch_state=source).update(
        dispatch_state=target, updated_at=now, **fields
    )
    return updated == 1
