"""Operator controls that check something before they move the task (``runtime.controls``)."""

from __future__ import annotations

import json

import pytest

from audit.models import TransitionEvent
from runtime import controls
from tasks import checkpoints
from tasks.checkpoints import CheckpointUnreadable
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.foreign_checkpoints import written_as

pytestmark = pytest.mark.django_db

OPERATOR = frozenset({"operator"})


def held_with_a_schema_0_checkpoint(tenant) -> Task:
    """Quarantined, its newest checkpoint written by old code at schema 0 (no migration path here)."""
    old = {"schema_version": 0, "body": lambda row: json.dumps({**json.loads(row.body), "schema_version": 0})}
    with written_as(**old):
        task = make_task(tenant)
    return advance(
        task.id, 1, State.QUARANTINED, actor=Actor.system("tests"), reason_code="checkpoint_unmigratable"
    )


def retry_migration(task: Task, user) -> controls.ControlResult:
    return controls.task_control(
        task, "retry_migration", user=user, roles=OPERATOR, expected_version=task.state_version,
        reason="migration 0->1 deployed",
    )  # fmt: skip


def test_retry_migration_writes_nothing_while_the_checkpoint_still_cannot_be_read(operator, acme):
    task = held_with_a_schema_0_checkpoint(acme)
    with pytest.raises(CheckpointUnreadable) as refused:
        retry_migration(task, operator)
    assert refused.value.reason == CheckpointUnreadable.UNMIGRATABLE
    assert Task.objects.get(pk=task.pk).state_version == task.state_version == 2
    assert TransitionEvent.objects.filter(task=task).count() == 2


def test_retry_migration_releases_once_a_deployment_can_read_the_checkpoint(operator, acme, monkeypatch):
    task = held_with_a_schema_0_checkpoint(acme)
    monkeypatch.setitem(checkpoints.MIGRATIONS, 0, lambda document: document)  # the fix, deployed
    result = retry_migration(task, operator)
    assert result.applied and result.task.state == State.RESUME_VALIDATION
    event = TransitionEvent.objects.get(task=task, state_version=3)
    assert event.trigger == "release" and event.reason_code == "retry_migration"
    assert event.actor_id == f"user:{operator.username}"
    assert "checkpoint now reads" in event.reason and "migration 0->1 deployed" in event.reason


def test_retry_migration_is_a_release_so_it_only_leaves_quarantine(operator, acme):
    task = make_task(acme)  # ready: nothing to release
    with pytest.raises(Exception, match="not possible from ready"):
        retry_migration(task, operator)
