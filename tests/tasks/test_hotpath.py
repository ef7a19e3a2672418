"""The compiled statements of a transition (``tasks.hotpath``) write and read exactly what the ORM does.

Each comparison writes the same values once through ``hotpath`` and once
through the ORM, then reads both rows back with plain SQL and compares every
column, value and Python type. The compare-and-set must also refuse, changing
nothing, a stale version, a wrong state, and a lease that lapsed or is not
the holder's.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import pytest
from django.db import connection, models
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from audit.models import TransitionEvent
from tasks import hotpath, leases, services
from tasks.models import Checkpoint, ExternalEvent, Lease, Task
from tasks.states import State
from tasks.transitions import WRITTEN
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
# Microseconds and a non-UTC offset: both must survive the field's own conversion.
WHEN = datetime(2026, 3, 29, 1, 59, 59, 123456, tzinfo=ZoneInfo("Europe/Berlin"))


def row(model: type[models.Model], pk: Any) -> dict[str, Any]:
    """The stored row as PostgreSQL returns it, column by column, no ORM conversion in between."""
    table = connection.ops.quote_name(model._meta.db_table)
    column = connection.ops.quote_name(model._meta.pk.column)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {table} WHERE {column} = %s", [pk])
        values = cursor.fetchone()
        names = [c.name for c in cursor.description]
    assert values is not None, f"no {model.__name__} row {pk}"
    return dict(zip(names, values, strict=True))


def typed(values: dict[str, Any], *, without: tuple[str, ...] = ()) -> dict[str, tuple[type, Any]]:
    return {name: (type(value), value) for name, value in values.items() if name not in without}


def twin_tasks(tenant) -> tuple[Task, Task]:
    """Two tasks created from the same request (so alike in every column but id and creation time)."""
    deadline = timezone.now() + timedelta(days=2)
    return make_task(tenant, deadline=deadline), make_task(tenant, deadline=deadline)


def changed(task: Task) -> Task:
    """Give ``task`` new values for every column a transition writes."""
    task.state = State.WAITING_INPUT
    task.state_reason = "asked_customer"
    task.updated_at = task.state_entered_at = WHEN
    task.audit_head = "ab" * 32
    task.wait_deadline = WHEN + timedelta(days=1)
    task.attempt = 3
    task.outcome = {"reason": "x", "amounts": [1, 2.5, None], "nested": {"ü": "ß", "ok": True}}
    task.escalation_level = 2
    task.escalated_to = "operator"
    task.escalation_reason = "looked odd — check by hand"
    task.policy_version = "2027-01"
    task.model_id, task.prompt_id, task.toolset_id = "m@2", "p@3", "t@4"
    return task


def test_load_task_reads_every_field_as_the_orm_does(acme, operator):
    task = make_task(acme, owner=operator, deadline=WHEN + timedelta(days=30), idempotency_key="k-1")
    fast, orm = hotpath.load_task(task.id), Task.objects.get(pk=task.id)
    assert fast is not None
    for field in Task._meta.concrete_fields:
        mine, theirs = getattr(fast, field.attname), getattr(orm, field.attname)
        assert (type(mine), mine) == (type(theirs), theirs), field.name
    assert (fast._state.adding, fast._state.db) == (orm._state.adding, orm._state.db)


def test_load_task_takes_the_id_as_text_and_answers_none_for_an_unknown_one(acme):
    task = make_task(acme)
    assert hotpath.load_task(str(task.id)).pk == task.pk
    assert hotpath.load_task(UUID(int=1)) is None


def test_compare_and_set_writes_every_column_as_an_orm_update_does(acme):
    fast, orm = twin_tasks(acme)
    before = row(Task, orm.pk)["created_at"]
    assert hotpath.compare_and_set(changed(fast), expected_version=1, from_state=State.READY, fields=WRITTEN)
    changed(orm)
    updated = Task.objects.filter(pk=orm.pk, state_version=1, state=State.READY).update(
        state_version=F("state_version") + 1, **{name: getattr(orm, name) for name in WRITTEN}
    )
    assert updated == 1
    fast_row, orm_row = row(Task, fast.pk), row(Task, orm.pk)
    # The input's sensitive values are sealed to each task's own id: equal in clear, not as ciphertext.
    ignored = ("id", "created_at", "input")
    assert typed(fast_row, without=ignored) == typed(orm_row, without=ignored)
    assert services.task_input(fast) == services.task_input(orm)
    assert (fast_row["state_version"], orm_row["created_at"]) == (2, before)


def test_compare_and_set_writes_only_the_fields_it_is_given(acme):
    task = make_task(acme)
    stored = row(Task, task.pk)
    changed(task)
    assert hotpath.compare_and_set(task, expected_version=1, from_state=State.READY, fields=["attempt"])
    after = row(Task, task.pk)
    assert (after["attempt"], after["state_version"]) == (3, 2)
    assert typed(after, without=("attempt", "state_version")) == typed(
        stored, without=("attempt", "state_version")
    )


def event_for(task: Task, *, parent: UUID | None) -> TransitionEvent:
    return TransitionEvent(
        task=task,
        tenant_id=task.tenant_id,
        state_version=7,
        from_state=State.READY,
        to_state=State.WAITING_INPUT,
        trigger="request_input",
        actor_kind="worker",
        actor_id="worker:w-ü",
        reason="asked — “which item?” 🧾",
        reason_code="asked",
        attempt=2,
        policy_version="2026-01",
        parent_id=parent,
        trace_id="0" * 32,
        checkpoint_digest="cd" * 32,
        created_at=WHEN,
        prev_hash="11" * 32,
        hash="22" * 32,
    )


def checkpoint_for(task: Task) -> Checkpoint:
    return Checkpoint(
        task=task,
        state_version=7,
        schema_version=3,
        codec="json-v1",
        body='{"step":"ask","facts":{"ü":"\\u0000"}}',
        digest="ef" * 32,
        created_at=WHEN,
    )


def external_event_for(task: Task) -> ExternalEvent:
    return ExternalEvent(
        task=task,
        event_key="ship-1",
        event_type="shipment.returned",
        payload={"tracking_number": "T-1", "items": [1, "two", None, 3.5], "ok": False},
        received_at=WHEN,
        applied_version=None,
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda task, parent: event_for(task, parent=parent),
        lambda task, parent: checkpoint_for(task),
        lambda task, parent: external_event_for(task),
    ],
    ids=["transition_event", "checkpoint", "external_event"],
)
def test_insert_writes_every_column_as_an_orm_insert_does(acme, build):
    fast_task, orm_task = twin_tasks(acme)
    parent = make_task(acme).id  # a non-null UUID column too
    fast, orm = build(fast_task, parent), build(orm_task, parent)
    model = type(fast)
    hotpath.insert(fast)
    orm.save(force_insert=True)
    fast_pk = model.objects.filter(task=fast_task).latest("pk").pk
    fast_row, orm_row = row(model, fast_pk), row(model, orm.pk)
    assert (fast_row["task_id"], orm_row["task_id"]) == (fast_task.pk, orm_task.pk)
    assert typed(fast_row, without=("id", "task_id")) == typed(orm_row, without=("id", "task_id"))


def test_insert_leaves_the_id_to_the_database_and_does_not_read_it_back(acme):
    task = make_task(acme)
    event = event_for(task, parent=None)
    hotpath.insert(event)
    assert event.pk is None
    assert TransitionEvent.objects.filter(task=task, state_version=7).exists()


def refused(task: Task, **kwargs: Any) -> bool:
    """The compare-and-set refused and the stored row is exactly as it was."""
    stored = row(Task, task.pk)
    task.attempt = 99
    kwargs = {"expected_version": task.state_version, "from_state": task.state, **kwargs}
    written = hotpath.compare_and_set(task, fields=["attempt"], **kwargs)
    return not written and row(Task, task.pk) == stored


def test_compare_and_set_refuses_a_stale_version(acme):
    task = make_task(acme)
    assert refused(task, expected_version=task.state_version - 1)
    assert refused(task, expected_version=task.state_version + 1)


def test_compare_and_set_refuses_a_task_no_longer_in_the_state_read(acme):
    assert refused(make_task(acme), from_state=State.RESUME_VALIDATION)


def test_compare_and_set_under_the_live_lease_of_its_holder_writes(acme):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="w", region="default")
    task.attempt = 4
    fence = (held.token, held.worker_id)
    assert hotpath.compare_and_set(
        task, expected_version=1, from_state=State.READY, fields=["attempt"], lease=fence
    )
    assert row(Task, task.pk)["attempt"] == 4


def test_compare_and_set_refuses_a_lease_that_lapsed(acme):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="w", region="default", ttl=timedelta(seconds=30))
    # Lapsed by the database's clock (the fence reads it, never the writer's).
    Lease.objects.filter(task=task).update(expires_at=Now())
    assert refused(task, lease=(held.token, held.worker_id))
    Lease.objects.filter(task=task).update(expires_at=Now() - timedelta(seconds=1))
    assert refused(task, lease=(held.token, held.worker_id))


def test_compare_and_set_refuses_a_lease_fence_that_is_not_the_holders(acme):
    task = make_task(acme)
    held = leases.claim(task.id, worker_id="w", region="default")
    assert refused(task, lease=(held.token - 1, held.worker_id))  # an earlier claim's token
    assert refused(task, lease=(held.token, "someone-else"))


def test_compare_and_set_refuses_a_lease_fence_on_a_task_nobody_holds(acme):
    task = make_task(acme)
    assert refused(task, lease=(1, "w"))
