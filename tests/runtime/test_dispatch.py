"""Sending an intended effect (``runtime.dispatch``) against the sandbox over real HTTP.

Every test counts the effects the authoritative system holds: the ledger may
be unsure, but an effect must never be doubled.
"""

from __future__ import annotations

import pytest

from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from tasks.models import Task
from tasks.states import State
from tests.runtime.payments import fault, invoice_task, payments, run

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.5
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.LEDGER_RESEND_BACKOFF = 0.05


def test_a_payment_is_dispatched_once_and_recorded(acme):
    task = run(invoice_task(acme))
    action = Action.objects.get(task=task)
    assert task.state == State.COMPLETED
    assert action.dispatch_state == DispatchState.SUCCEEDED and action.attempts == 1
    assert task.outcome["payment_ref"] == action.external_ref == str(Effect.objects.get().pk)
    assert Effect.objects.get().idempotency_key == action.idempotency_key
    # intent committed before the send (checkpoint before dispatch), outcome recorded after
    assert [e.trigger for e in TransitionEvent.objects.filter(task=task).order_by("state_version")] == [
        "start",
        "step",
        "step",
        "complete",
    ]


def test_nothing_is_resent_while_the_outcome_is_unknown(acme):
    fault("timeout", seconds=1)
    task = run(invoice_task(acme))
    for _ in range(3):
        run(Task.objects.get(pk=task.pk))
    assert payments() == 1 and Action.objects.get(task=task).attempts == 1


def test_a_rejected_payment_fails_the_task_and_is_never_sent_again(acme):
    fault("reject")
    task = run(invoice_task(acme))
    action = Action.objects.get(task=task)
    assert (task.state, task.state_reason) == (State.FAILED, "effect_rejected")
    assert (action.dispatch_state, action.outcome["status"]) == (DispatchState.FAILED, "rejected")
    assert (action.attempts, payments()) == (1, 0)
    run(task)
    assert Action.objects.get(pk=action.pk).attempts == 1
