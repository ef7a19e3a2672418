"""What a database owner can do behind the application's back, for the tamper tests.

The test connection is the owner (it ran the migrations): it may disable any
trigger, rewrite rows and recompute the chain with the real key, exactly the
attacker the anchors are for.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection

from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, keyed_hash
from audit.keys import current_chain_key
from audit.models import TransitionEvent
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress


def task_with_history(tenant, steps: int = 3) -> Task:
    task = make_task(tenant)
    for n in range(steps):
        task = advance(
            task.id, task.state_version, State.READY, actor=Actor.worker("w"), progress=progress(f"s{n}")
        )
    return task


@contextmanager
def triggers_off(*tables: str) -> Iterator[object]:
    """Every user trigger of ``tables`` disabled for the block, as only an owner may."""
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending FK checks: ALTER TABLE refuses them
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} DISABLE TRIGGER USER")
        yield cursor
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        for table in tables:
            cursor.execute(f"ALTER TABLE {table} ENABLE TRIGGER USER")


def rewrite_event(task: Task, version: int, **changes: object) -> None:
    """Edit one event, recompute every later link with the real current key and move the task's head."""
    key = current_chain_key()
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    prev = events[version - 2].hash if version > 1 else "0" * 64
    with triggers_off("audit_transitionevent") as cursor:
        for event in events[version - 1 :]:
            if event.state_version == version:
                for name, value in changes.items():
                    setattr(event, name, value)
            fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
            event.prev_hash, event.hash, event.key_id = prev, keyed_hash(prev, fields, key.secret), key.id
            cursor.execute(
                "UPDATE audit_transitionevent SET reason = %s, actor_id = %s, prev_hash = %s, hash = %s,"
                " key_id = %s WHERE id = %s",
                [event.reason, event.actor_id, event.prev_hash, event.hash, event.key_id, event.id],
            )
            prev = event.hash
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", [prev, task.id])


def delete_task(task: Task) -> None:
    """Delete a task with everything that refers to it, around every guard."""
    tables = ("tasks_task", "tasks_checkpoint", "audit_transitionevent", "ledger_action")
    with triggers_off(*tables) as cursor:
        for table in ("tasks_checkpoint", "audit_transitionevent", "tasks_lease", "ledger_action"):
            cursor.execute(f"DELETE FROM {table} WHERE task_id = %s", [task.id])
        cursor.execute("DELETE FROM tasks_task WHERE id = %s", [task.id])
