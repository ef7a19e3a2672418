"""A step's commit on PostgreSQL: one statement, one round trip, and nothing written when it is refused.

``tasks.transitions`` folds a transition's history rows (its event, checkpoint, outbox rows, anchor
request, a model turn's usage) into the compare-and-set (``tasks.hotpath.compare_and_set(inserts=…)``):
``WITH moved AS (UPDATE tasks_task … RETURNING id), addedN AS (INSERT … SELECT … FROM moved) …``.
With nothing else in its transaction it runs outside one (autocommit): one round trip on the wire,
counted from libpq's protocol trace as ``test_claim_statement`` counts the claim's. A refused
compare-and-set (a stale version, a lost lease, a failover) must insert nothing at all and raise
exactly as before; a row that breaks a constraint must leave the task as it was. The rows the folded
statement writes are compared column by column with the ORM's.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.db import IntegrityError, connection
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from audit.models import AnchorRequest, TransitionEvent
from ledger.models import Action
from runtime.models import ModelUsage
from tasks import hotpath, leases
from tasks.audit_paths import verify_chain
from tasks.exceptions import LeaseLost, StaleEpoch, StaleVersion
from tasks.models import Checkpoint, Lease, Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, Append, advance, advance_read
from tests.conftest import make_task, progress
from tests.tasks.test_claim_statement import round_trips
from tests.tasks.test_hotpath import checkpoint_for, event_for, external_event_for, row, twin_tasks, typed

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite commits with the ORM's statements"),
]
WORKER = Actor.worker("w")
REFUND = ActionIntent(step="refund", connector="payments", effect={"amount": "1.00", "order": "A-1"})


def claimed(acme) -> tuple[Task, leases.Held]:
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="w", region="default")
    assert held is not None
    read = hotpath.load_task(task.id)
    assert read is not None
    return read, held


def usage(task: Task, counted: list[str]) -> Append:
    """A model turn's usage row, as ``runtime.usage.recorder`` hands it over, noting its commit."""
    row = ModelUsage(
        task_id=task.id, step="think", state_version=task.state_version, attempt=task.attempt,
        model_id="m@1", input_tokens=3, output_tokens=4, cost=Decimal("0.000123"), committed=True,
        recorded_at=timezone.now(),
    )  # fmt: skip
    return Append(row, committed=lambda: counted.append("counted"))


def history(task: Task) -> dict[str, int]:
    """How many rows of each kind a transition adds this task has."""
    return {
        "events": TransitionEvent.objects.filter(task_id=task.id).count(),
        "checkpoints": Checkpoint.objects.filter(task_id=task.id).count(),
        "actions": Action.objects.filter(task_id=task.id).count(),
        "anchors": AnchorRequest.objects.filter(task_id=task.id).count(),
        "usage": ModelUsage.objects.filter(task_id=task.id).count(),
    }


def a_step(task: Task, held: leases.Held, counted: list[str]):
    """The worker's step commit at its richest: a checkpoint, an intent (outbox row and anchor
    request), a model turn's usage."""
    return advance_read(
        task, State.READY, actor=WORKER, trigger=Trigger.STEP, progress=progress("refund"), lease=held,
        actions=[REFUND], also=[usage(task, counted)],
    )  # fmt: skip


def test_a_step_commit_is_one_round_trip_with_all_its_rows(acme):
    task, held = claimed(acme)
    counted: list[str] = []
    with round_trips() as trips:
        done = a_step(task, held, counted)
    assert trips == [1]  # no BEGIN, no COMMIT, no INSERT of its own
    assert done.task.state_version == 2
    assert history(task) == {"events": 2, "checkpoints": 2, "actions": 1, "anchors": 1, "usage": 1}
    assert counted == ["counted"]  # after the commit
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state_version, stored.audit_head) == (2, done.task.audit_head)
    event = TransitionEvent.objects.get(task_id=task.id, state_version=2)
    assert event.checkpoint_digest == Checkpoint.objects.get(task_id=task.id, state_version=2).digest
    assert verify_chain(stored) is None
    assert Action.objects.get(task_id=task.id).idempotency_key == REFUND.idempotency_key(task.id)


def test_the_end_releasing_its_lease_is_one_round_trip_too(acme):
    task, held = claimed(acme)
    with round_trips() as trips:
        done = advance_read(
            task, State.COMPLETED, actor=WORKER, trigger=Trigger.COMPLETE, progress=progress("done"),
            lease=held, release=True, outcome={"ok": True},
        )  # fmt: skip
    assert trips == [1]
    assert done.released and done.task.state == State.COMPLETED
    lease = Lease.objects.get(task_id=task.id)
    assert lease.expires_at == lease.heartbeat_at <= timezone.now()
    assert history(task) == {
        "events": 2,
        "checkpoints": 2,
        "actions": 0,
        "anchors": 1,
        "usage": 0,
    }


def test_advance_reads_then_commits_in_two_round_trips(acme):
    task = make_task(acme)
    with round_trips() as trips:
        advance(task.id, 1, State.READY, actor=WORKER, trigger=Trigger.STEP, progress=progress("next"))
    assert trips == [2]  # the read, the statement: no transaction around them
    assert Task.objects.get(pk=task.pk).state_version == 2


def test_a_caller_write_keeps_the_transaction_of_several_statements(acme):
    task, held = claimed(acme)
    ran: list[bool] = []
    with round_trips() as trips:
        advance_read(
            task, State.READY, actor=WORKER, trigger=Trigger.STEP, progress=progress("next"), lease=held,
            also=[lambda: ran.append(connection.in_atomic_block)],
        )  # fmt: skip
    assert ran == [True]  # inside the transition's transaction, as before
    assert trips[0] > 2  # BEGIN, the update, its rows, COMMIT
    assert history(task)["events"] == 2


def stale_version(task: Task, held: leases.Held) -> type[Exception]:
    other = hotpath.load_task(task.id)
    advance_read(other, State.READY, actor=WORKER, trigger=Trigger.STEP, progress=progress("x"), lease=held)
    return StaleVersion


def lease_lost(task: Task, held: leases.Held) -> type[Exception]:
    Lease.objects.filter(task_id=task.id).update(expires_at=Now())  # lapsed by the database's clock
    taken = leases.claim(task.id, worker_id="other", region="default")
    assert taken is not None and taken.token == held.token + 1
    return LeaseLost


def lease_lapsed(task: Task, held: leases.Held) -> type[Exception]:
    Lease.objects.filter(task_id=task.id).update(expires_at=Now())  # nobody took it: still lost
    return LeaseLost


def failed_over(task: Task, held: leases.Held) -> type[Exception]:
    Task.objects.filter(pk=task.id).update(ownership_epoch=F("ownership_epoch") + 1, region="eu")
    return StaleEpoch


@pytest.mark.parametrize("refusal", [stale_version, lease_lost, lease_lapsed, failed_over])
def test_a_refused_commit_inserts_nothing_and_raises_as_before(acme, refusal):
    task, held = claimed(acme)
    expected = refusal(task, held)
    before_task, before_lease = row(Task, task.pk), Lease.objects.values().get(task_id=task.id)
    before = history(task)
    counted: list[str] = []
    with round_trips() as trips, pytest.raises(expected) as raised:
        a_step(task, held, counted)
    assert type(raised.value) is expected  # LeaseLost is a StaleVersion: exactly the one expected
    assert trips == [2]  # the statement, then the read that names the refusal
    assert history(task) == before
    assert counted == []
    assert row(Task, task.pk) == before_task
    assert Lease.objects.values().get(task_id=task.id) == before_lease


def test_a_refused_end_neither_releases_nor_inserts(acme):
    task, held = claimed(acme)
    lease_lost(task, held)
    before, before_lease = history(task), Lease.objects.values().get(task_id=task.id)
    with pytest.raises(LeaseLost):
        advance_read(
            task, State.COMPLETED, actor=WORKER, trigger=Trigger.COMPLETE, progress=progress("done"),
            lease=held, release=True, outcome={},
        )  # fmt: skip
    assert history(task) == before
    assert Lease.objects.values().get(task_id=task.id) == before_lease
    assert Task.objects.get(pk=task.pk).state == State.READY


def test_a_row_breaking_a_constraint_leaves_the_task_as_it_was(acme):
    """One statement is all or nothing: the task does not move if one of its rows cannot be written."""
    task, held = claimed(acme)
    first = a_step(task, held, [])
    before_task, before = row(Task, task.pk), history(task)
    counted: list[str] = []
    with pytest.raises(IntegrityError):  # the same intent again: its idempotency key exists
        a_step(first.task, held, counted)
    assert row(Task, task.pk) == before_task
    assert history(task) == before
    assert counted == []
    # The connection goes on (no transaction was left open): the next commit goes through.
    advance_read(
        hotpath.load_task(task.id), State.READY, actor=WORKER, trigger=Trigger.STEP,
        progress=progress("after"), lease=held,
    )  # fmt: skip
    assert Task.objects.get(pk=task.pk).state_version == 3


def test_folded_rows_are_written_column_for_column_as_the_orm_writes_them(acme):
    fast_task, orm_task = twin_tasks(acme)
    parent = make_task(acme).id
    builders = [
        lambda t: event_for(t, parent=parent),
        checkpoint_for,
        external_event_for,
        lambda t: AnchorRequest(requested_at=timezone.now(), reason="complete", task_id=t.id),
        lambda t: usage(t, []).row,
    ]
    fast_rows, orm_rows = [build(fast_task) for build in builders], [build(orm_task) for build in builders]
    fast_task.attempt = 5
    assert hotpath.compare_and_set(
        fast_task, expected_version=1, from_state=State.READY, fields=["attempt"], inserts=fast_rows
    )
    for orm in orm_rows:
        orm.save(force_insert=True)
    for fast, orm in zip(fast_rows, orm_rows, strict=True):
        model = type(fast)
        assert fast.pk is None  # as ``hotpath.insert``: the id is the database's, not read back
        fast_pk = model.objects.filter(task_id=fast_task.id).latest("pk").pk
        mine, theirs = row(model, fast_pk), row(model, orm.pk)
        assert (mine["task_id"], theirs["task_id"]) == (fast_task.pk, orm_task.pk)
        ignored = ("id", "task_id", "requested_at", "recorded_at")  # the last two: the builders' now
        assert typed(mine, without=ignored) == typed(theirs, without=ignored), model.__name__


def test_a_refused_compare_and_set_inserts_none_of_its_rows(acme):
    task = make_task(acme)
    rows = [event_for(task, parent=None), checkpoint_for(task), external_event_for(task)]
    assert not hotpath.compare_and_set(
        task, expected_version=2, from_state=State.READY, fields=["attempt"], inserts=rows
    )
    assert not TransitionEvent.objects.filter(task=task, state_version=7).exists()
    assert not Checkpoint.objects.filter(task=task, state_version=7).exists()
    assert not task.external_events.exists()
    assert Task.objects.get(pk=task.pk).state_version == 1
