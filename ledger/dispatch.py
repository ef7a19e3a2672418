"""Sending an intended effect, once per claim, and recording what came back.

1. Claim: the intent row moves ``intended``/``reconciled_absent`` ->
   ``dispatching`` under ``SELECT … FOR UPDATE SKIP LOCKED``; a second
   claimer gets nothing.
2. Send: the connector is called outside any transaction, with a timeout.
3. Record: ``succeeded`` / ``failed`` on a definite answer, ``unknown``
   otherwise. An unknown action is never sent again until the reconciler has
   looked it up and found it absent.
A process that dies between 1 and 3 leaves the action ``dispatching``: in doubt,
and settled by the reconciler exactly like ``unknown``.
"""

from __future__ import annotations

import logging

from django.db import transaction

from ledger import connectors
from ledger.connectors.base import OutcomeUnknown, Rejected
from ledger.models import SENDABLE, Action, DispatchState
from ledger.services import action_move
from tasks import chaos

log = logging.getLogger(__name__)


def claim(action_id: int) -> Action | None:
    """Take a sendable action for this process, or None if it is not sendable or taken."""
    with transaction.atomic():
        action = (
            Action.objects.select_for_update(skip_locked=True)
            .filter(pk=action_id, dispatch_state__in=SENDABLE)
            .first()
        )
        if action is None or not action_move(action.pk, action.dispatch_state, DispatchState.DISPATCHING):
            return None
    return Action.objects.get(pk=action_id)


def send(action: Action) -> Action:
    """Call the connector for a claimed (``dispatching``) action and record the answer."""
    connector = connectors.get(action.connector)
    try:
        outcome = connector.dispatch(action.idempotency_key, dict(action.effect))
        chaos.after_send(action)
    except Rejected as exc:
        target, fields = (
            DispatchState.FAILED,
            {
                "last_error": str(exc)[:2000],
                "outcome": {"status": "rejected", "detail": str(exc)[:500]},
            },
        )
    except OutcomeUnknown as exc:
        log.warning("outcome unknown", extra={"action": action.idempotency_key, "error": str(exc)})
        target, fields = DispatchState.UNKNOWN, {"last_error": str(exc)[:2000]}
    else:
        target = DispatchState.SUCCEEDED if outcome.status == "succeeded" else DispatchState.FAILED
        fields = {
            "external_ref": outcome.external_ref,
            "outcome": {"status": outcome.status, "record_version": outcome.record_version, **outcome.detail},
            "duplicates_suppressed": action.duplicates_suppressed + int(outcome.replayed),
        }
    if not action_move(action.pk, DispatchState.DISPATCHING, target, **fields):
        # Settled meanwhile by a reconciler that asked the system itself; its record stands.
        log.warning(
            "answer arrived after the action was settled",
            extra={"action": action.idempotency_key, "answer": target},
        )
    return Action.objects.get(pk=action.pk)


def claim_and_send(action_id: int) -> Action:
    """Send the action if this process can claim it; either way return its current row."""
    claimed = claim(action_id)
    return send(claimed) if claimed is not None else Action.objects.get(pk=action_id)
