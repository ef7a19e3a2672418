"""The sweep lifts an older deployment's quarantine over an intent-scheme key, and only that one.

An older worker (keys from the task id) meeting an unsettled action this deployment keyed by the
client's intent quarantines the task as ``effect_changed_after_intent``. ``runtime.rollout`` checks
the key again in the action's own scheme: the facts unchanged, the task goes to resume validation;
the facts changed, or an action of the task-id scheme, the quarantine stands.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from ledger import integrity, keys
from ledger.models import Action
from runtime import rollout
from runtime.sweep import sweep
from tasks import registry, services
from tasks.checkpoints import Progress
from tasks.exceptions import TransitionNotAllowed
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
OLDER_WORKER = Actor.worker("older-host:4242")


def intended(tenant, *, client_key: str | None = "client-order-7/pay") -> tuple[Task, dict]:
    """A ``pay_invoice`` task whose payment is intended (keyed by this deployment) and unsent."""
    task = make_task(
        tenant,
        task_type="pay_invoice",
        objective="Pay INV-7",
        input={"invoice_id": "INV-7", "amount": "70.00", "currency": "EUR"},
        idempotency_key=client_key,
    )
    facts = dict(services.latest_checkpoint(task).facts)
    intent = ActionIntent("pay", "payments", registry.get("pay_invoice").step("pay").effect(facts))
    advance(task.id, task.state_version, State.READY, actor=Actor.worker("newer-host:1"),
            progress=Progress(step="pay", facts=facts), actions=[intent])  # fmt: skip
    return Task.objects.get(pk=task.pk), facts


def quarantined_by_an_older_worker(task: Task, facts: dict, code: str = rollout.CHANGED_AFTER_INTENT) -> Task:
    advance(
        task.id,
        task.state_version,
        State.QUARANTINED,
        actor=OLDER_WORKER,
        trigger=Trigger.QUARANTINE,
        progress=Progress(step="pay", facts=facts),
        reason="pay: the facts changed after the key was intended",
        reason_code=code,
    )
    return Task.objects.get(pk=task.pk)


def test_a_quarantine_over_an_unchanged_intent_key_is_lifted_by_the_sweep(acme):
    task, facts = intended(acme)
    action = Action.objects.get(task=task)
    assert action.key_scheme == keys.Scheme.INTENT
    task = quarantined_by_an_older_worker(task, facts)

    report = sweep(lambda task_id, region: None, region=task.region)
    assert report.quarantines_lifted == 1
    task.refresh_from_db()
    assert task.state == State.RESUME_VALIDATION
    lifted = TransitionEvent.objects.get(task=task, from_state=State.QUARANTINED)
    assert (lifted.reason_code, lifted.trigger, lifted.actor_id) == (
        rollout.LIFTED,
        Trigger.DEPLOYMENT_CHANGED,
        "system:sweep",
    )
    assert action.idempotency_key in lifted.reason
    assert Action.objects.get(task=task).idempotency_key == action.idempotency_key  # untouched


def test_a_quarantine_over_facts_that_did_change_stands(acme):
    task, facts = intended(acme)
    task = quarantined_by_an_older_worker(task, {**facts, "amount": "7000.00"})
    assert rollout.lift_key_scheme_quarantines(task.region, 10) == 0
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED


def test_a_quarantine_of_a_task_keyed_by_its_id_stands(acme):
    """No client key: the task-id scheme, which the older code computes as well; its quarantine is real."""
    task, facts = intended(acme, client_key=None)
    assert Action.objects.get(task=task).key_scheme == keys.Scheme.TASK
    task = quarantined_by_an_older_worker(task, facts)
    assert rollout.lift_key_scheme_quarantines(task.region, 10) == 0
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED


def test_only_the_system_lifts_and_only_out_of_quarantine(acme):
    task, facts = intended(acme)
    task = quarantined_by_an_older_worker(task, facts)
    with pytest.raises(TransitionNotAllowed):  # a worker may not: the lift is the sweep's alone
        advance(task.id, task.state_version, State.RESUME_VALIDATION, actor=Actor.worker("w"),
                trigger=Trigger.DEPLOYMENT_CHANGED, reason_code=rollout.LIFTED)  # fmt: skip


# --- what the app role can do without the chain key (the attacks of issue 20) --------------------------


def test_a_quarantine_held_for_another_reason_and_relabelled_by_sql_stands(acme):
    """Held for a tampered effect (only an operator releases that); one ``UPDATE`` of the column the app
    writes says the older deployment's reason. The chain still says why it is held: the sweep leaves it."""
    task, facts = intended(acme)
    task = quarantined_by_an_older_worker(task, facts, code=integrity.EFFECT_DIGEST_MISMATCH)
    Task.objects.filter(pk=task.pk).update(state_reason=rollout.CHANGED_AFTER_INTENT)

    assert sweep(lambda task_id, region: None, region=task.region).quarantines_lifted == 0
    task.refresh_from_db()
    assert (task.state, task.state_version) == (State.QUARANTINED, 3)
    assert not TransitionEvent.objects.filter(task=task, reason_code=rollout.LIFTED).exists()


def test_a_quarantine_written_without_the_chain_key_stands(acme):
    """An inserted event saying the older deployment's reason, the task row pointed at it: not a keyed
    link, so nothing the sweep lifts (and the worker would not resume from it either)."""
    task, _ = intended(acme)
    last = task.events.get(state_version=task.state_version)
    version = task.state_version + 1
    TransitionEvent.objects.create(
        task=task, tenant=task.tenant, state_version=version, from_state=task.state,
        to_state=State.QUARANTINED, trigger=Trigger.QUARANTINE, actor_kind="worker",
        actor_id=OLDER_WORKER.id, reason="pay: the facts changed", reason_code=rollout.CHANGED_AFTER_INTENT,
        attempt=last.attempt, policy_version=last.policy_version, created_at=timezone.now(),
        prev_hash=last.hash, hash="f" * 64, key_id=last.key_id,
    )  # fmt: skip
    Task.objects.filter(pk=task.pk).update(
        state=State.QUARANTINED, state_version=version, state_reason=rollout.CHANGED_AFTER_INTENT
    )

    assert rollout.lift_key_scheme_quarantines(task.region, 10) == 0
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED
