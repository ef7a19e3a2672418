"""The ledger's only writer (``ledger.services.action_move``): guarded moves of an action's dispatch state.

Every move is one compare-and-set on the source state, optionally also on the
send count seen (so an answer about one send never settles the next) and on
a fence (so a worker that lost its task's lease writes nothing).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger.models import Action, DispatchState
from ledger.services import action_move
from tasks import leases
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db


def intended(tenant) -> Action:
    """A payment intent committed with its task's transition, not yet sent."""
    task = make_task(
        tenant, task_type="pay_invoice", objective="Pay", input={"invoice_id": "I-1", "amount": "5"}
    )
    intent = ActionIntent(step="pay", connector="payments", effect={"kind": "charge", "amount": "5"})
    advance(
        task.id,
        1,
        State.READY,
        actor=Actor.worker("w"),
        trigger=Trigger.STEP,
        progress=progress("pay"),
        actions=[intent],
    )
    return Action.objects.get(task=task)


def test_a_move_the_ledgers_table_does_not_allow_is_refused_and_changes_nothing(acme):
    action = intended(acme)
    with pytest.raises(ValueError, match="cannot go from intended to succeeded"):
        action_move(action.pk, DispatchState.INTENDED, DispatchState.SUCCEEDED)
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.INTENDED


def test_claiming_a_send_counts_it_and_stamps_when_it_was_claimed(acme):
    action = intended(acme)
    assert action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING, attempts=0)
    claimed = Action.objects.get(pk=action.pk)
    assert (claimed.dispatch_state, claimed.attempts) == (DispatchState.DISPATCHING, 1)
    assert claimed.dispatched_at is not None and claimed.resolved_at is None


def test_a_second_claim_from_the_same_state_changes_nothing(acme):
    action = intended(acme)
    assert action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    assert not action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    assert Action.objects.get(pk=action.pk).attempts == 1


def test_an_unknown_answer_stamps_since_when_and_a_settled_one_when_it_was_resolved(acme):
    action = intended(acme)
    action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    assert action_move(action.pk, DispatchState.DISPATCHING, DispatchState.UNKNOWN, attempts=1)
    unknown = Action.objects.get(pk=action.pk)
    assert unknown.unknown_since is not None and unknown.resolved_at is None
    assert action_move(action.pk, DispatchState.UNKNOWN, DispatchState.RECONCILED_SUCCEEDED, attempts=1)
    settled = Action.objects.get(pk=action.pk)
    assert settled.resolved_at >= settled.unknown_since


def test_an_answer_about_an_earlier_send_cannot_settle_a_later_one(acme):
    action = intended(acme)
    action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING)
    action_move(action.pk, DispatchState.DISPATCHING, DispatchState.RECONCILED_ABSENT, attempts=1)
    action_move(action.pk, DispatchState.RECONCILED_ABSENT, DispatchState.DISPATCHING, attempts=1)
    # The first send's slow answer arrives while the second send is in flight.
    assert not action_move(action.pk, DispatchState.DISPATCHING, DispatchState.SUCCEEDED, attempts=1)
    current = Action.objects.get(pk=action.pk)
    assert (current.dispatch_state, current.attempts) == (DispatchState.DISPATCHING, 2)


def test_a_worker_whose_lease_lapsed_cannot_claim_the_send(acme):
    action = intended(acme)
    held = leases.claim(action.task_id, worker_id="w", region="default", ttl=timedelta(seconds=-1))
    moved = action_move(
        action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING, fence=leases.fence(held)
    )
    assert not moved
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.INTENDED


def test_the_worker_holding_the_live_lease_claims_the_send(acme):
    action = intended(acme)
    held = leases.claim(action.task_id, worker_id="w", region="default")
    assert action_move(action.pk, DispatchState.INTENDED, DispatchState.DISPATCHING, fence=leases.fence(held))
