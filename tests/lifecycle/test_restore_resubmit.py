"""A client that re-submits after a restore does not pay twice (issue 21, item 1).

Before: a ``pay_invoice`` task created with ``POST /api/tasks/`` and an
``idempotency_key`` paid its invoice; our database was then restored to before
that task existed (the payment system keeps its own records, and kept the
payment); the client sent the same body with the same ``idempotency_key`` again,
got a new task with a new id — and its effect key ``<task id>:<step>:<digest>``
was new, so the invoice was paid a second time. Now the key of a task started
with a client key derives from the tenant, the task type and that key: the
re-created task sends the same key, the payment system answers with its first
payment, and the task completes on it. Counted at the sandbox over live HTTP.
"""

from __future__ import annotations

import json

import pytest

from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger import keys
from ledger.models import Action, DispatchState
from runtime import reconcile
from tasks import effect_keys, registry, services
from tasks.checkpoints import Progress
from tasks.models import Task
from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import api_client_for
from tests.ledger import restore
from tests.ledger.restore import forget
from tests.runtime.payments import fault, run

pytestmark = pytest.mark.django_db(transaction=True)

BODY = {
    "task_type": "pay_invoice",
    "objective": "Pay INV-21",
    "input": {"invoice_id": "INV-21", "amount": "400.00", "currency": "EUR"},
    "idempotency_key": "client-order-21/pay",
}


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0


def create(operator, body: dict = BODY) -> Task:
    response = api_client_for(operator).post("/api/tasks/", json.dumps(body), content_type="application/json")
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


def payments_of(invoice: str) -> list[Effect]:
    return [e for e in Effect.objects.filter(system="payments") if e.request.get("invoice") == invoice]


def paid_then_restored_away(operator) -> tuple[Task, Effect]:
    """The task pays; the restore loses it (and every row about it); the payment stays."""
    task = run(create(operator))
    assert task.state == State.COMPLETED
    [paid] = payments_of("INV-21")
    forget([task.id])
    assert not Task.objects.filter(pk=task.pk).exists() and not Action.objects.exists()
    return task, paid


def test_a_resubmitted_create_after_a_restore_pays_the_invoice_once(operator, acme):
    lost, paid = paid_then_restored_away(operator)
    again = run(create(operator))  # the same body, the same idempotency key
    assert again.id != lost.id  # a new task: the database never saw the old one
    assert again.state == State.COMPLETED
    [only] = payments_of("INV-21")  # exactly one payment for the invoice
    assert only.pk == paid.pk
    assert again.outcome["payment_ref"] == str(paid.pk)


def test_a_resubmit_after_restoring_a_dump_taken_before_the_create_pays_once(operator, acme, tmp_path):
    backup = restore.dump(tmp_path / "before-the-create.dump")
    lost = run(create(operator))
    assert lost.state == State.COMPLETED
    restore.restore(backup)  # our database, back to before the task; the payment system keeps its own
    assert not Task.objects.filter(pk=lost.pk).exists() and not Action.objects.exists()
    again = run(create(operator))
    assert again.state == State.COMPLETED
    [paid] = payments_of("INV-21")
    assert (paid.deliveries, again.outcome["payment_ref"]) == (2, str(paid.pk))


def test_the_payment_system_answered_the_repeat_with_its_first_result(operator, acme):
    _, paid = paid_then_restored_away(operator)
    again = run(create(operator))
    action = Action.objects.get(task=again)
    assert action.key_scheme == keys.Scheme.INTENT
    assert action.idempotency_key == paid.idempotency_key  # the same key, not a new effect
    assert action.dispatch_state == DispatchState.SUCCEEDED and action.external_ref == str(paid.pk)
    assert action.duplicates_suppressed == 1  # counted: the system suppressed a duplicate
    paid.refresh_from_db()
    assert paid.deliveries == 2  # it arrived twice and was performed once
    # The re-created task's own chain says the step was done on the system's first payment.
    event = TransitionEvent.objects.get(task=again, reason_code="effect_deduplicated")
    assert paid.idempotency_key in event.reason and str(paid.pk) in event.reason


def test_the_key_carries_the_tenant_and_only_a_hash_of_the_client_key(operator, acme):
    task = run(create(operator))
    key = Action.objects.get(task=task).idempotency_key
    assert key.startswith(f"k2.{acme.pk}.") and BODY["idempotency_key"] not in key
    assert "/" not in key  # the client key's slash would not fit the sandbox's URL path
    assert len(key) <= 200


def test_a_create_without_a_client_key_still_pays_again_after_a_restore(operator, acme):
    """No client key, nothing to recognize the request by: the old key scheme, as before."""
    body = {k: v for k, v in BODY.items() if k != "idempotency_key"}
    first = run(create(operator, body))
    assert Action.objects.get(task=first).idempotency_key.startswith(f"{first.id}:pay:")
    forget([first.id])
    second = run(create(operator, body))
    assert second.state == State.COMPLETED
    assert len(payments_of("INV-21")) == 2  # why clients should always send an idempotency key


def test_an_action_keyed_by_the_old_scheme_is_reconciled_by_its_stored_key(operator, acme, monkeypatch):
    """An intent written by a worker of the older deployment (the task-id key) for a task with a client
    key: the newer code neither quarantines it as changed nor looks it up under another key."""
    fault("timeout", seconds=1)  # the payment lands, its answer does not
    monkeypatch.setattr(effect_keys, "_stable_scope", lambda task: None)  # the older code's keys
    task = run(create(operator))
    monkeypatch.undo()
    assert task.state == State.OUTCOME_UNKNOWN
    action = Action.objects.get(task=task)
    assert action.key_scheme == keys.Scheme.TASK and action.idempotency_key.startswith(f"{task.id}:pay:")
    reconcile.reconcile_task(task.id, actor=Actor.system("tests"), force=True)
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED
    action.refresh_from_db()
    assert action.dispatch_state == DispatchState.RECONCILED_SUCCEEDED
    [paid] = payments_of("INV-21")
    assert paid.idempotency_key == action.idempotency_key and paid.deliveries == 1


def test_an_intent_keyed_by_the_old_scheme_is_sent_with_its_stored_key(operator, acme, monkeypatch):
    """Committed by a worker of the older deployment, not sent before it stopped: the newer worker
    sends it under its stored key rather than calling it changed ("effect_changed_after_intent")."""
    task = create(operator)
    facts = dict(services.latest_checkpoint(task).facts)
    intent = ActionIntent("pay", "payments", registry.get("pay_invoice").step("pay").effect(facts))
    monkeypatch.setattr(effect_keys, "_stable_scope", lambda task: None)  # the older code's keys
    advance(
        task.id,
        task.state_version,
        State.READY,
        actor=Actor.worker("old-deployment"),
        progress=Progress(step="pay", facts=facts),
        actions=[intent],
    )
    monkeypatch.undo()
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED, task.state_reason
    action = Action.objects.get(task=task)
    assert (action.key_scheme, action.idempotency_key) == (keys.Scheme.TASK, intent.idempotency_key(task.id))
    [paid] = payments_of("INV-21")
    assert (paid.idempotency_key, paid.deliveries) == (action.idempotency_key, 1)
