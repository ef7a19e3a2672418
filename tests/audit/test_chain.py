"""The audit log is hash-chained per task; tampering is detected."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from audit.models import TransitionEvent
from audit.verify import verify_task
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db


def task_with_history(tenant, steps: int = 3) -> Task:
    task = make_task(tenant)
    for n in range(steps):
        task = advance(
            task.id, task.state_version, State.READY, actor=Actor.worker("w"), progress=progress(f"s{n}")
        )
    return task


def tamper(sql: str, params: list) -> None:
    """Edit the log as someone with owner rights would: around the append-only trigger."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SET CONSTRAINTS ALL IMMEDIATE"
        )  # flush deferred FK checks so the table can be altered
        cursor.execute("ALTER TABLE audit_transitionevent DISABLE TRIGGER audit_transitionevent_append_only")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE audit_transitionevent ENABLE TRIGGER audit_transitionevent_append_only")


def test_an_untouched_history_verifies(acme, capsys):
    task_with_history(acme)
    call_command("verify_audit")
    assert "OK: 1 task chains verified" in capsys.readouterr().out


def test_editing_an_event_is_detected_at_that_event(acme, capsys):
    task = task_with_history(acme)
    tamper(
        "UPDATE audit_transitionevent SET actor_id = 'someone-else' WHERE task_id = %s AND state_version = 3",
        [task.id],
    )
    with pytest.raises(CommandError, match="1 of 1"):
        call_command("verify_audit")
    assert f"task {task.id} v3: contents do not match" in capsys.readouterr().err


def test_deleting_the_newest_event_is_detected(acme):
    task = task_with_history(acme)
    tamper("DELETE FROM audit_transitionevent WHERE task_id = %s AND state_version = 4", [task.id])
    link = verify_task(Task.objects.get(pk=task.pk))
    assert link is not None and "log ends at v3, task is at v4" in link.problem


def test_deleting_a_middle_event_is_detected(acme):
    task = task_with_history(acme)
    tamper("DELETE FROM audit_transitionevent WHERE task_id = %s AND state_version = 2", [task.id])
    link = verify_task(Task.objects.get(pk=task.pk))
    assert link is not None and link.state_version == 2 and "missing event" in link.problem


def test_only_damaged_tasks_are_reported(acme, capsys):
    good, bad = task_with_history(acme), task_with_history(acme)
    tamper(
        "UPDATE audit_transitionevent SET reason = 'edited' WHERE task_id = %s AND state_version = 1",
        [bad.id],
    )
    with pytest.raises(CommandError):
        call_command("verify_audit")
    err = capsys.readouterr().err
    assert str(bad.id) in err and str(good.id) not in err


def test_the_log_refuses_updates_and_deletes(acme):
    task = task_with_history(acme, steps=1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TransitionEvent.objects.filter(task=task).update(reason="rewritten")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TransitionEvent.objects.filter(task=task).delete()
    assert TransitionEvent.objects.filter(task=task).count() == 2
