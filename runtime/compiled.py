"""Reads a worker repeats on every step, compiled once per connection.

Building a queryset's SQL costs the worker more CPU than PostgreSQL spends running it: an agent step's
read of its run's turns and ledger actions (``runtime.sdk.step``) spent most of its time in the ORM's
compiler. ``rows`` compiles a queryset once per thread's connection, with stand-in values for what
changes between calls (a task id, a step name), and afterwards only swaps the values in. Rows come
back as the queryset would give them: every column through its field's converters.

The queryset stays the one description of the read, so the statement cannot drift from the models;
``tasks.hotpath`` does the same for the transition's own statements.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import QuerySet
from django.db.models.sql.compiler import SQLCompiler

from tasks.models import Task

_TASK = UUID(int=0)  # the stand-in task id


def _text(n: int) -> str:
    """The n-th stand-in text: no real name begins with a unit separator."""
    return f"\x1fstand-in-{n}"


@dataclass(frozen=True)
class _Compiled:
    sql: str
    params: tuple[Any, ...]
    task_slots: tuple[int, ...]
    text_slots: tuple[tuple[int, int], ...]  # (position in params, index of the text argument)
    compiler: SQLCompiler
    converters: dict[int, Any]


_cache: weakref.WeakKeyDictionary[BaseDatabaseWrapper, dict[str, _Compiled]] = weakref.WeakKeyDictionary()


def _task_value(task_id: UUID | str, connection: BaseDatabaseWrapper) -> Any:
    pk = Task._meta.pk
    assert pk is not None
    return pk.get_db_prep_value(pk.to_python(task_id), connection)


def _compile(build: Callable[..., QuerySet[Any]], texts: int, connection: BaseDatabaseWrapper) -> _Compiled:
    stand_ins = [_text(n) for n in range(texts)]
    queryset = build(_TASK, *stand_ins)
    compiler = queryset.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    task = _task_value(_TASK, connection)
    task_slots = tuple(i for i, value in enumerate(params) if value == task)
    text_slots = tuple((i, stand_ins.index(value)) for i, value in enumerate(params) if value in stand_ins)
    if not task_slots or len({n for _, n in text_slots}) != texts:
        raise ValueError(
            "a stand-in does not appear as a parameter: compare values exactly (no contains, no casts)"
        )
    converters = compiler.get_converters([column for column, _, _ in compiler.select])
    return _Compiled(sql, tuple(params), task_slots, text_slots, compiler, converters)


def rows(
    key: str, build: Callable[..., QuerySet[Any]], task_id: UUID | str, *texts: str
) -> list[tuple[Any, ...]]:
    """``list(build(task_id, *texts))`` for a ``values_list`` queryset (a union of them too), whose SQL is
    built once per connection. ``build`` must use its arguments only as exact values (``task=…``,
    ``step=…``): they are found among the compiled statement's parameters."""
    connection = connections[DEFAULT_DB_ALIAS]  # the thread's own wrapper
    compiled_here = _cache.setdefault(connection, {})
    compiled = compiled_here.get(key)
    if compiled is None:
        compiled = compiled_here[key] = _compile(build, len(texts), connection)
    params = list(compiled.params)
    task = _task_value(task_id, connection)
    for slot in compiled.task_slots:
        params[slot] = task
    for slot, n in compiled.text_slots:
        params[slot] = texts[n]
    with connection.cursor() as cursor:
        cursor.execute(compiled.sql, params)
        found: list[tuple[Any, ...]] = cursor.fetchall()
    if compiled.converters:
        found = [tuple(row) for row in compiled.compiler.apply_converters(found, compiled.converters)]
    return found
