"""What a transition costs PostgreSQL: the index entries of each write.

- A step commit (the state, its entry time and its reason unchanged) changes no indexed column, so it
  is a HOT update: no index of ``tasks_task`` gets an entry. Counted with PostgreSQL's own
  per-transaction counters (``pg_stat_get_xact_tuples_hot_updated``), so a new index on a column every
  step writes (``updated_at``, ``audit_head``, ``state_version``) fails here.
- The references are indexed only where set (migration 0016), and lookups by them still use those
  indexes; ``tasks_task`` keeps room on its pages for HOT updates (``fillfactor``).
"""

from __future__ import annotations

import pytest
from django.db import connection

from tasks.models import REFERENCES, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db


def _counts() -> tuple[int, int]:
    """(updates, HOT updates) of ``tasks_task`` in this transaction so far."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_stat_get_xact_tuples_updated('tasks_task'::regclass),"
            " pg_stat_get_xact_tuples_hot_updated('tasks_task'::regclass)"
        )
        updated, hot = cursor.fetchone()
    return updated, hot


def _plan(sql: str, params: list) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a handful of rows: ask which index it would use
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(line for (line,) in cursor.fetchall())


def test_a_step_commit_writes_no_index_entry_and_a_state_change_does(acme):
    task = make_task(acme)
    before = _counts()
    task = advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress("look_up"))
    task = advance(task.id, 2, State.READY, actor=Actor.worker("w1"), progress=progress("decide"))
    updated, hot = (now - then for now, then in zip(_counts(), before, strict=True))
    assert (updated, hot) == (2, 2)  # both step commits: HOT

    before = _counts()
    advance(task.id, 3, State.COMPLETED, actor=Actor.worker("w1"), progress=progress("done"), outcome={})
    updated, hot = (now - then for now, then in zip(_counts(), before, strict=True))
    assert (updated, hot) == (1, 0)  # the state moved: indexed, a new entry in each index that takes it


def test_the_task_table_leaves_room_for_hot_updates_and_indexes_references_only_where_set():
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'tasks_task'")
        (options,) = cursor.fetchone()
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'tasks_task'"
            " AND indexdef NOT LIKE '%%WHERE%%' AND indexdef NOT LIKE '%%,%%'"
        )
        single = sorted(line for (line,) in cursor.fetchall())
    assert options == ["fillfactor=80"]
    # Every one-column index without a predicate: only the primary key (the tenant's own is gone: a
    # prefix of task_tenant_id), and no reference is indexed for the many rows without one.
    assert single == ["CREATE UNIQUE INDEX tasks_task_pkey ON public.tasks_task USING btree (id)"]


@pytest.mark.parametrize("name", REFERENCES)
def test_a_lookup_by_a_reference_uses_its_partial_index(acme, name):
    task = make_task(acme)
    column = Task._meta.get_field(name).column
    plan = _plan(
        f'SELECT id FROM tasks_task WHERE "{column}" = %s', [task.pk if name in ("parent", "rerun_of") else 1]
    )
    assert f"task_{name}" in plan, plan


def test_a_lookup_by_tenant_uses_the_tenant_and_id_index(acme):
    plan = _plan("SELECT id FROM tasks_task WHERE tenant_id = %s", [acme.pk])
    assert "task_tenant_" in plan, plan
