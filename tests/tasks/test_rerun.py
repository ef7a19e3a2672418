"""``tasks.services.task_rerun``: a new task linked to an ended one, which is never written."""

from __future__ import annotations

import pytest

from ledger.models import Action
from tasks.exceptions import TransitionNotAllowed
from tasks.models import Task
from tasks.services import task_input, task_rerun
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

BY = Actor.system("tests")


def ended(tenant, state: State, **overrides) -> Task:
    task = make_task(tenant, **overrides)
    worker = Actor.worker("w")
    task = advance(
        task.id,
        1,
        State.READY,
        actor=worker,
        progress=progress("pay_refund"),
        actions=[ActionIntent(step="pay_refund", connector="payments", effect={"amount": "10.00"})],
    )
    if state == State.FAILED:
        return advance(task.id, 2, State.FAILED, actor=worker, trigger=Trigger.FAIL, reason="declined")
    if state == State.CANCELED:
        task = advance(
            task.id,
            2,
            State.CANCEL_REQUESTED,
            actor=Actor(ActorKind.OPERATOR, "user:op"),
            trigger=Trigger.CANCEL,
        )
        return advance(task.id, 3, State.CANCELED, actor=BY, trigger=Trigger.CANCEL_CONFIRMED)
    if state == State.EXPIRED:
        return advance(task.id, 2, State.EXPIRED, actor=BY, trigger=Trigger.DEADLINE_PASSED)
    if state == State.COMPLETED:
        return advance(task.id, 2, State.COMPLETED, actor=worker, trigger=Trigger.COMPLETE)
    return task


@pytest.mark.parametrize("state", [State.FAILED, State.EXPIRED, State.CANCELED])
def test_a_rerun_is_a_new_task_with_the_same_request_linked_to_the_old(acme, operator, state):
    old = ended(acme, state, owner=operator, objective="Refund order A-1")
    new, created = task_rerun(old, actor=BY, reason="the customer called again")
    assert created and new.pk != old.pk
    assert (new.rerun_of_id, new.state, new.state_version) == (old.pk, State.READY, 1)
    assert (new.tenant_id, new.task_type, new.objective, task_input(new), new.owner_id) == (
        old.tenant_id,
        old.task_type,
        old.objective,
        task_input(old),  # each copy sealed to its own task
        old.owner_id,
    )
    assert list(old.reruns.all()) == [new]


def test_the_rerun_says_which_task_it_reruns_in_its_first_event(acme):
    old = ended(acme, State.FAILED)
    new, _ = task_rerun(old, actor=BY, reason="fixed the card")
    event = new.events.get(state_version=1)
    assert (event.trigger, event.from_state, event.to_state) == (Trigger.START, "", State.READY)
    assert event.reason == f"rerun of {old.id} (failed): fixed the card"
    assert event.hash == new.audit_head


def test_the_old_task_is_never_written(acme):
    old = ended(acme, State.FAILED)
    before = Task.objects.values().get(pk=old.pk)
    events_before = list(old.events.order_by("state_version").values_list("hash", flat=True))
    task_rerun(old, actor=BY, reason="again")
    task_rerun(Task.objects.get(pk=old.pk), actor=BY, reason="and again")
    assert Task.objects.values().get(pk=old.pk) == before
    assert list(old.events.order_by("state_version").values_list("hash", flat=True)) == events_before


def test_a_rerun_is_a_new_idempotency_scope(acme):
    old = ended(acme, State.FAILED, idempotency_key="order-A-1")
    new, _ = task_rerun(old, actor=BY, reason="again")
    assert new.idempotency_key is None and new.deadline is None
    # The ledger keys derive from the task id: the rerun's effects cannot be taken for the old ones.
    advance(
        new.id,
        1,
        State.READY,
        actor=Actor.worker("w"),
        progress=progress("pay_refund"),
        actions=[ActionIntent(step="pay_refund", connector="payments", effect={"amount": "10.00"})],
    )
    keys = set(Action.objects.filter(task__in=[old, new]).values_list("idempotency_key", flat=True))
    assert len(keys) == 2


def test_the_same_key_returns_the_same_rerun(acme):
    old = ended(acme, State.FAILED)
    first, created = task_rerun(old, actor=BY, reason="again", idempotency_key="rerun-1")
    second, created_again = task_rerun(old, actor=BY, reason="again", idempotency_key="rerun-1")
    assert (created, created_again, second.pk) == (True, False, first.pk)


@pytest.mark.parametrize("state", [State.READY, State.COMPLETED])
def test_only_a_failed_expired_or_canceled_task_can_be_rerun(acme, state):
    old = ended(acme, state)
    with pytest.raises(TransitionNotAllowed):
        task_rerun(old, actor=BY, reason="again")
    assert not Task.objects.filter(rerun_of=old).exists()
