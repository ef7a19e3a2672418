"""Effect keys that survive the task database (issue 21, item 1; ``ledger.keys``, ``tasks.effect_keys``).

A task started with a client idempotency key keys its effects by the tenant, the task
type and that key — and its children and compensation runs by that identity — so the
same request made again after our database forgot the task intends the same keys.
Every other task keeps the task-id key, and every stored action keeps the key (and
scheme) it was written with.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError
from django.utils import timezone

from ledger import keys
from ledger.models import Action
from tasks import children, effect_keys
from tasks.models import Task
from tasks.services import task_create
from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import REFUND_INPUT, make_task, progress
from tests.ledger.restore import forget

pytestmark = pytest.mark.django_db(transaction=True)

EFFECT = {"kind": "refund", "amount": "10.00", "order": "A-1"}
INTENT = ActionIntent(step="refund", connector="payments", effect=EFFECT)


def intend(task: Task, intent: ActionIntent = INTENT) -> Action:
    """Commit ``intent`` for ``task`` as the engine's transition does; the ledger row written."""
    advance(
        task.id,
        task.state_version,
        State.READY,
        actor=Actor.worker("w"),
        progress=progress("dispatch"),
        actions=[intent],
    )
    return Action.objects.get(task=task, step=intent.step)


def test_a_task_without_a_client_key_keeps_todays_key(acme):
    task = make_task(acme)
    action = intend(task)
    assert action.idempotency_key == f"{task.id}:refund:{INTENT.digest[:16]}"
    assert action.key_scheme == keys.Scheme.TASK


def test_a_task_recreated_with_the_same_client_key_intends_the_same_key(acme):
    first = make_task(acme, idempotency_key="order-A-1")
    key = intend(first).idempotency_key
    forget([first.id])  # a restore from before it existed
    again = make_task(acme, idempotency_key="order-A-1")
    action = intend(again)
    assert again.id != first.id
    assert action.idempotency_key == key and action.key_scheme == keys.Scheme.INTENT
    assert action.idempotency_key == keys.intent_scope(acme.pk, "refund_request", "order-A-1").key(
        "refund", INTENT.digest
    )


def test_a_different_effect_of_the_same_task_has_a_different_key(acme):
    task = make_task(acme, idempotency_key="order-A-1")
    other = ActionIntent(step="refund", connector="payments", effect={**EFFECT, "amount": "11.00"})
    scope = effect_keys.scope_of(task)
    assert INTENT.idempotency_key(scope) != other.idempotency_key(scope)


def test_two_tenants_with_the_same_client_key_get_different_effect_keys(acme, globex):
    ours = intend(make_task(acme, idempotency_key="order-A-1"))
    theirs = intend(make_task(globex, idempotency_key="order-A-1"))
    assert ours.idempotency_key != theirs.idempotency_key
    assert ours.idempotency_key.startswith(f"k2.{acme.pk}.")
    assert theirs.idempotency_key.startswith(f"k2.{globex.pk}.")
    assert (keys.tenant_of(ours.idempotency_key), keys.tenant_of(theirs.idempotency_key)) == (
        acme.pk,
        globex.pk,
    )


def test_a_key_of_the_task_scheme_names_no_tenant(acme):
    assert keys.tenant_of(intend(make_task(acme)).idempotency_key) is None


def test_the_same_client_key_for_another_task_type_gets_another_key(acme):
    refund = effect_keys.scope_of(make_task(acme, idempotency_key="k-1"))
    paying = effect_keys.scope_of(
        make_task(
            acme,
            task_type="pay_invoice",
            idempotency_key="k-1-pay",
            input={"invoice_id": "I", "amount": "1.00"},
        )
    )
    assert refund != paying
    assert keys.intent_scope(acme.pk, "refund_request", "k") != keys.intent_scope(acme.pk, "pay_invoice", "k")


def start_children(parent: Task) -> Task:
    with transaction.atomic():
        children.start(
            parent,
            "fan_out",
            [{"task_type": "refund_request", "input": REFUND_INPUT}],
            actor=Actor.system("t"),
        )
    [child] = children.of_step(parent, "fan_out")
    return child


def test_a_childs_keys_are_stable_across_a_recreation_of_its_parent(acme):
    parent = make_task(acme, idempotency_key="batch-7")
    child = start_children(parent)
    key = intend(child).idempotency_key
    forget([parent.id])  # and its child with it
    again = start_children(make_task(acme, idempotency_key="batch-7"))
    action = intend(again)
    assert again.id != child.id
    assert action.idempotency_key == key and action.key_scheme == keys.Scheme.INTENT


def test_a_child_of_a_parent_without_a_client_key_keeps_todays_key(acme):
    child = start_children(make_task(acme))
    action = intend(child)
    assert action.key_scheme == keys.Scheme.TASK and action.idempotency_key.startswith(f"{child.id}:")


def compensation_run(task: Task, action: Action) -> Task:
    run, _ = task_create(
        tenant=task.tenant,
        task_type=task.task_type,
        objective=f"Undo {action.step}",
        input=REFUND_INPUT,
        actor=Actor.system("tests"),
        rerun_of=task,
        compensates=action,
    )
    return run


UNDO = ActionIntent(step="undo_refund", connector="payments", effect={"kind": "reverse", "order": "A-1"})


def test_a_compensation_runs_keys_are_stable_across_its_recreation(acme):
    task = make_task(acme, idempotency_key="order-A-1")
    undone = intend(task)
    run = compensation_run(task, undone)
    key = intend(run, UNDO).idempotency_key
    forget([run.id])  # the restore lost the run, not the task it undoes
    again = compensation_run(task, undone)
    action = intend(again, UNDO)
    assert again.id != run.id
    assert action.idempotency_key == key and action.key_scheme == keys.Scheme.INTENT
    assert key.startswith(f"k2.{acme.pk}.") and key != undone.idempotency_key


def test_a_later_compensation_run_of_the_same_action_gets_new_keys(acme):
    task = make_task(acme, idempotency_key="order-A-1")
    undone = intend(task)
    first = compensation_run(task, undone)
    advance(first.id, first.state_version, State.FAILED, actor=Actor.worker("w"), reason="refused")
    second = compensation_run(task, undone)
    assert effect_keys.scope_of(first) != effect_keys.scope_of(second)


def test_a_compensation_run_of_an_action_keyed_by_task_id_keeps_todays_key(acme):
    task = make_task(acme)
    run = compensation_run(task, intend(task))
    assert intend(run, UNDO).idempotency_key.startswith(f"{run.id}:undo_refund:")


def test_a_rerun_without_a_key_of_its_own_does_not_take_its_originals_keys(acme):
    task = make_task(acme, idempotency_key="order-A-1")
    rerun, _ = task_create(
        tenant=acme, task_type=task.task_type, objective="again", input=REFUND_INPUT,
        actor=Actor.system("tests"), rerun_of=task,
    )  # fmt: skip
    assert effect_keys.scope_of(rerun) == keys.task_scope(rerun.id)


def test_the_scheme_an_action_was_written_with_decides_the_key_computed_again(acme):
    task = make_task(acme, idempotency_key="order-A-1")
    old = INTENT.idempotency_key(effect_keys.scope_of(task, keys.Scheme.TASK))
    assert old == f"{task.id}:refund:{INTENT.digest[:16]}"
    assert INTENT.idempotency_key(effect_keys.scope_of(task, keys.Scheme.INTENT)).startswith("k2.")


def test_a_row_written_without_a_scheme_by_an_older_deployment_is_of_the_task_scheme(acme):
    task = make_task(acme)
    now = timezone.now()
    with connection.cursor() as cursor:  # the older code's INSERT: it does not know the column
        cursor.execute(
            "INSERT INTO ledger_action (task_id, step, idempotency_key, connector, effect, effect_digest,"
            " dispatch_state, attempts, last_error, external_ref, duplicates_suppressed, created_at,"
            " updated_at)"
            " VALUES (%s, 'refund', %s, 'payments', '{}', %s, 'intended', 0, '', '', 0, %s, %s)",
            [task.id, INTENT.idempotency_key(task.id), INTENT.digest, now, now],
        )
    assert Action.objects.get(task=task).key_scheme == keys.Scheme.TASK


def test_an_actions_key_scheme_cannot_be_rewritten(acme):
    action = intend(make_task(acme, idempotency_key="order-A-1"))
    with pytest.raises(DatabaseError), connection.cursor() as cursor:
        cursor.execute("UPDATE ledger_action SET key_scheme = 1 WHERE id = %s", [action.pk])
