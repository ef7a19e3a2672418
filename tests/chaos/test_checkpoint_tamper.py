"""A real worker refuses a checkpoint edited behind the application's back.

The amount a ``pay_invoice`` task pays comes from its checkpoint. If one byte
of the stored body is changed by SQL, the worker must quarantine the task with
``checkpoint_digest_mismatch`` before deciding anything: no payment intended
in the ledger, none sent to the payments system.
"""

from __future__ import annotations

import pytest
from django.db import connection

from demo.sandbox.models import Effect
from ledger.models import Action
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def test_a_worker_quarantines_a_checkpoint_whose_amount_was_edited_by_sql_and_pays_nothing(acme, workers):
    task = make_task(
        acme,
        task_type="pay_invoice",
        objective="Pay INV-7",
        input={"invoice_id": "INV-7", "amount": "25.00", "currency": "EUR"},
    )
    with connection.cursor() as cursor:
        cursor.execute(
            'UPDATE tasks_checkpoint SET body = replace(body, \'"amount":"25.00"\', \'"amount":"95.00"\')'
            " WHERE task_id = %s",
            [task.id],
        )
        assert cursor.rowcount == 1
    assert '"amount":"95.00"' in task.checkpoints.get().body

    workers()
    wait_for(
        lambda: state_of(task)[0] in (State.QUARANTINED, State.COMPLETED),
        what="the worker to pick the task up",
    )

    stored = Task.objects.get(pk=task.pk)
    intended = [action.effect.get("amount") for action in Action.objects.filter(task=task)]
    paid = [effect.request.get("amount") for effect in Effect.objects.filter(system="payments")]
    assert (stored.state, stored.state_reason, intended, paid) == (
        State.QUARANTINED,
        "checkpoint_digest_mismatch",
        [],
        [],
    )
