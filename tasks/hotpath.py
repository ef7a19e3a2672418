"""The statements every transition runs, compiled once per connection.

The ORM rebuilds SQL on each call; for the three statements of a transition
(read the task, compare-and-set it, insert its history rows) that cost more
client CPU than PostgreSQL spent executing them (``bench/transitions.py``).
Here the SQL is built once from the models' own metadata, and every value
still passes through its field's database conversion in both directions, so
the statements cannot drift from the models.

The reads (``load``, ``rows``) are compiled from a queryset instead, with stand-in values for what
changes between calls (a task id, a step name), which are afterwards only swapped in: the queryset
stays the one description of the read. ``runtime.compiled`` serves the worker's own reads with them.

Every one of these statements goes through ``hot_cursor()``: on PostgreSQL it is sent with its values
bound by the server and as a prepared statement of the session, so PostgreSQL parses and plans it
once per connection instead of at every call (Django's own cursors bind on the client and cannot
prepare). Not where psycopg's prepared statements are off (``prepare_threshold`` None:
``DATABASE_POOLER=transaction``, ``config.dsn.pooled``), nor on SQLite: Django's cursor then.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import ForeignObjectRel, QuerySet
from django.db.models.sql.compiler import SQLCompiler

from audit.models import TransitionEvent
from tasks.models import CancelRequest, CancelScope, Checkpoint, Lease, Task

_cache: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def _connection() -> BaseDatabaseWrapper:
    return connections[DEFAULT_DB_ALIAS]  # the thread's own wrapper, not the module-level proxy


def _prepared() -> dict[Any, Any]:
    """This connection's compiled statements (connections are per thread, and so is this)."""
    found = _cache.get(_connection())
    if found is None:
        found = _cache[_connection()] = {}
    return found


def hot_cursor() -> CursorWrapper:
    """A cursor for a hot statement: Django's cursor (its error translation, its execute wrappers, its
    query log) over a psycopg cursor that binds on the server and prepares each statement on its first
    run, when the connection allows prepared statements; Django's own cursor otherwise.

    psycopg keeps what it prepared per connection: a new connection (a reconnect, a failover, another
    of the pool's) prepares its statements anew; one whose first run fails is prepared again on its
    next, and a rollback makes psycopg forget (and deallocate) them all, to be prepared again."""
    connection = _connection()
    if connection.vendor != "postgresql":
        return connection.cursor()
    connection.close_if_health_check_failed()  # as connection.cursor() does
    connection.ensure_connection()
    raw = connection.connection
    # The one source of truth: the connection's prepare_threshold (None behind a transaction pooler,
    # where a statement prepared in one server session is unknown to the next one).
    if raw.prepare_threshold is None:
        return connection.cursor()
    with connection.wrap_database_errors:
        cursor = _preparing_cursor(connection, raw)
        wrapped: CursorWrapper = connection._prepare_cursor(cursor)  # type: ignore[attr-defined]
        return wrapped


def _preparing_cursor(connection: BaseDatabaseWrapper, raw: Any) -> Any:
    found = _preparing_class()(raw)
    # As Django's create_cursor: the cursor's time zone when the connection's differs.
    if connection.timezone != raw.adapters.get_loader(_timestamptz(), _TEXT).timezone:
        from django.db.backends.postgresql.psycopg_any import register_tzloader

        register_tzloader(connection.timezone, found)
    return found


_TEXT = 0  # psycopg.pq.Format.TEXT


@dataclass(frozen=True)
class _Sent:
    """A statement as Django's query log reads it from a psycopg cursor (``last_executed_query``):
    its text, the values bound apart."""

    text: str

    @property
    def query(self) -> bytes:
        return self.text.encode()


@functools.cache
def _timestamptz() -> int:
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID  # imports psycopg: PostgreSQL only

    return int(TIMESTAMPTZ_OID)


@functools.cache
def _preparing_class() -> type:
    """Django's server-binding cursor (``OPTIONS["server_side_binding"]``'s), preparing on the first run."""
    import psycopg  # PostgreSQL only
    from django.db.backends.postgresql.base import ServerBindingCursor
    from psycopg import _queries

    class ParsedOnce(_queries.PostgresQuery):
        """psycopg keeps its parse of a statement's text (where its ``%s`` go) only for statements of
        at most 50 parameters (``MAX_CACHED_STATEMENT_PARAMS``) and 4 kB: an ORM's ``IN`` lists would
        fill its cache. A step's folded commit has more, so psycopg parsed it anew at every execute
        (about 5 % of a worker's CPU). The hot statements are a few texts built once per process:
        their parse is kept whatever their size."""

        __slots__ = ()

        def convert(self, query: Any, vars: Any) -> None:
            if not isinstance(query, str) or vars is None:
                return super().convert(query, vars)
            self.query, self._want_formats, self._order, self._parts = _parsed(
                query.encode(self._tx.encoding), self._tx.encoding
            )
            self.dump(vars)

    _parsed = functools.lru_cache(maxsize=256)(_queries._query2pg_nocache)

    # psycopg's Cursor named again only for the type checker: ServerBindingCursor is one already.
    class Preparing(ServerBindingCursor, psycopg.Cursor[Any]):
        _query_cls = ParsedOnce

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = True, **kwargs: Any
        ) -> Any:
            # In a pipeline, the first run's Parse goes out with its Bind and Execute, one round trip
            # (outside one psycopg waits for the Parse's answer first); leaving it waits for the
            # results, so the cursor holds them (its rowcount too) and an error is raised here.
            with self.connection.pipeline():
                super().execute(query, params, prepare=prepare, **kwargs)
            # psycopg keeps no query of a prepared run; Django's query log reads one.
            self._query = _Sent(query)  # type: ignore[assignment]
            return self

    return Preparing


def _column(model: type[models.Model], name: str) -> str:
    return _quoted(_connection(), model._meta.get_field(name))


def _now(connection: BaseDatabaseWrapper) -> str:
    """The database's own now, in SQL (a lease's liveness is judged by its clock, never the worker's)."""
    if connection.vendor == "postgresql":
        return "STATEMENT_TIMESTAMP()"  # as Django's Now(): the statement's time, not the transaction's
    return "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"  # SQLite (the demo): as Now() there


def _quoted(connection: BaseDatabaseWrapper, field: models.Field[Any, Any] | ForeignObjectRel) -> str:
    # Only concrete fields are named here, and they always have a column (the types also allow
    # reverse relations and column-less fields).
    assert isinstance(field, models.Field) and field.column is not None, field
    return connection.ops.quote_name(field.column)


_SENTINEL = UUID(int=0)  # the stand-in task id


def _text(n: int) -> str:
    """The n-th stand-in text: no real name begins with a unit separator."""
    return f"\x1fstand-in-{n}"


def _task_value(task_id: UUID | str, connection: BaseDatabaseWrapper) -> Any:
    """A task id as this backend binds it."""
    return Task._meta.pk.get_db_prep_value(Task._meta.pk.to_python(task_id), connection)


@dataclass(frozen=True)
class _Query:
    """A queryset compiled once with stand-ins, and where the real values go among its parameters."""

    sql: str
    params: tuple[Any, ...]
    task_slots: tuple[int, ...]
    text_slots: tuple[tuple[int, int], ...]  # (position in params, index of the text argument)
    compiler: SQLCompiler
    converters: dict[int, Any]
    model: type[models.Model]
    names: tuple[str, ...]  # the model's concrete fields, from which ``load`` makes an instance
    annotations: tuple[str, ...]


def _compile(build: Callable[..., QuerySet[Any]], texts: int, connection: BaseDatabaseWrapper) -> _Query:
    stand_ins = [_text(n) for n in range(texts)]
    queryset = build(_SENTINEL, *stand_ins)
    compiler = queryset.query.get_compiler(connection=connection)
    sql, params = compiler.as_sql()
    task = _task_value(_SENTINEL, connection)
    task_slots = tuple(i for i, value in enumerate(params) if value == task)
    text_slots = tuple((i, stand_ins.index(value)) for i, value in enumerate(params) if value in stand_ins)
    if not task_slots or len({n for _, n in text_slots}) != texts:
        raise ValueError(
            "a stand-in does not appear as a parameter: compare values exactly (no contains, no casts)"
        )
    converters = compiler.get_converters([column for column, _, _ in compiler.select])
    model = queryset.model
    names = tuple(f.attname for f in model._meta.concrete_fields)
    annotations = tuple(queryset.query.annotation_select)
    return _Query(sql, tuple(params), task_slots, text_slots, compiler, converters, model, names, annotations)


def _select(
    key: tuple[str, str],
    build: Callable[..., QuerySet[Any]],
    task_id: UUID | str,
    texts: tuple[str, ...],
    *,
    first: bool,
) -> tuple[_Query, list[tuple[Any, ...]]]:
    """Run ``build(task_id, *texts)``, compiled once per connection under ``key``: its rows (only the
    first one if ``first``), every column through its field's converters."""
    connection, prepared = _connection(), _prepared()
    query: _Query | None = prepared.get(key)
    if query is None:
        query = prepared[key] = _compile(build, len(texts), connection)
    params = list(query.params)
    task = _task_value(task_id, connection)
    for slot in query.task_slots:
        params[slot] = task
    for slot, n in query.text_slots:
        params[slot] = texts[n]
    with hot_cursor() as cursor:
        cursor.execute(query.sql, params)
        if first:
            row = cursor.fetchone()
            found: list[tuple[Any, ...]] = [] if row is None else [row]
        else:
            found = cursor.fetchall()
    if found and query.converters:
        found = [tuple(row) for row in query.compiler.apply_converters(found, query.converters)]
    return query, found


def rows(
    key: str, build: Callable[..., QuerySet[Any]], task_id: UUID | str, *texts: str
) -> list[tuple[Any, ...]]:
    """``list(build(task_id, *texts))`` for a ``values_list`` queryset (a union of them too), whose SQL is
    built once per connection, with stand-in values, and afterwards only the values change. ``build``
    must use its arguments only as exact values (``task=…``, ``step=…``): they are found among the
    compiled statement's parameters (``ValueError`` if one is not)."""
    return _select(("rows", key), build, task_id, texts, first=False)[1]


def load(key: str, build: Callable[[UUID], QuerySet[Any]], task_id: UUID | str) -> Any:
    """``build(task_id).first()`` for any one-row read keyed by a task id: the query is compiled once
    per connection, with a stand-in id, then only the id changes.

    Annotations of the query are set on the row as attributes, as the ORM would.
    """
    query, found = _select(("load", key), build, task_id, (), first=True)
    if not found:
        return None
    (row,) = found
    instance = query.model.from_db(_connection().alias, query.names, row[: len(query.names)])
    for name, extra in zip(query.annotations, row[len(query.names) :], strict=True):
        setattr(instance, name, extra)
    return instance


class Columns:
    """A model's columns as a hand-written statement selects them: named once (``select``), and a
    row's slice of them turned back into an instance as the ORM would (``load``: every value through
    its field's converters). ``defer``: columns left out (the instance has them deferred)."""

    def __init__(
        self, model: type[models.Model], connection: BaseDatabaseWrapper, *, defer: Sequence[str] = ()
    ) -> None:
        queryset = model._default_manager.defer(*defer) if defer else model._default_manager.all()
        compiler = queryset.query.get_compiler(connection=connection)
        compiler.setup_query()
        selected = [column for column, _, _ in compiler.select]
        self.model, self.compiler = model, compiler
        self.fields: list[models.Field[Any, Any]] = [column.target for column in selected]
        self.converters = compiler.get_converters(selected)
        self.names = [field.attname for field in self.fields]
        self.width = len(self.fields)
        self._quoted = [_quoted(connection, field) for field in self.fields]
        self._pk = self.names.index(model._meta.pk.attname)

    def select(self, alias: str) -> str:
        """The select list, every column qualified by ``alias``."""
        return ", ".join(f"{alias}.{column}" for column in self._quoted)

    def load(self, values: Sequence[Any]) -> Any:
        """The instance ``values`` (this model's slice of a row) are; None when its key is NULL (an
        outer join that found nothing)."""
        if values[self._pk] is None:
            return None
        if self.converters:
            values = next(self.compiler.apply_converters([values], self.converters))
        return self.model.from_db(_connection().alias, self.names, values)


@dataclass(frozen=True)
class Stored:
    """A task's newest checkpoint (None: it has none) and the audit event that vouches for it (None:
    none recorded it), read together in one statement; what ``tasks.services.latest_checkpoint``
    verifies and decodes. ``version``: the task's ``state_version`` in the snapshot they were read in
    (a claim's), None when read on their own: they are the newest for that version only."""

    checkpoint: Checkpoint | None
    event: TransitionEvent | None
    version: int | None = None

    @property
    def recorded_digest(self) -> str | None:
        """The digest the vouching event recorded of the checkpoint (as ``decode_stored`` takes it)."""
        return None if self.event is None else self.event.checkpoint_digest

    def current_for(self, task: Task) -> bool:
        """Whether these are still the newest for ``task`` as it is now: read at its version."""
        return self.version is not None and self.version == task.state_version


class StoredRead:
    """The SQL that reads a task's newest checkpoint (alias ``k``) with its vouching event (alias
    ``e``: the event of the same task and version, at most one), joinable into another statement
    (``joined``, PostgreSQL: the claim's) or run on its own (``newest_checkpoint``)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.checkpoint, self.event = Columns(Checkpoint, connection), Columns(TransitionEvent, connection)
        self.width = self.checkpoint.width + self.event.width
        q = connection.ops.quote_name
        self._checkpoints, self._events = q(Checkpoint._meta.db_table), q(TransitionEvent._meta.db_table)
        self._task, self._version = _column(Checkpoint, "task"), _column(Checkpoint, "state_version")
        self._vouches = (
            f"e.{_column(TransitionEvent, 'task')} = k.{self._task}"
            f" AND e.{_column(TransitionEvent, 'state_version')} = k.{self._version}"
        )

    def select(self) -> str:
        return f"{self.checkpoint.select('k')}, {self.event.select('e')}"

    def joined(self, task_id: str) -> str:
        """``LEFT JOIN``s adding ``k`` and ``e`` for the task whose id is the SQL ``task_id``."""
        newest = (
            f"SELECT {self.checkpoint.select('n')} FROM {self._checkpoints} n"
            f" WHERE n.{self._task} = {task_id} ORDER BY n.{self._version} DESC LIMIT 1"
        )
        return f"LEFT JOIN LATERAL ({newest}) k ON TRUE LEFT JOIN {self._events} e ON {self._vouches}"

    def alone(self) -> str:
        """The read on its own, for the task id given as its one parameter (any backend)."""
        return (
            f"SELECT {self.select()} FROM {self._checkpoints} k LEFT JOIN {self._events} e ON {self._vouches}"
            f" WHERE k.{self._task} = %s ORDER BY k.{self._version} DESC LIMIT 1"
        )

    def load(self, values: Sequence[Any], version: int | None = None) -> Stored:
        """``Stored`` from this read's slice of a row."""
        split = self.checkpoint.width
        return Stored(self.checkpoint.load(values[:split]), self.event.load(values[split:]), version)


def stored_read() -> StoredRead:
    """This connection's ``StoredRead`` (built once per connection)."""
    prepared = _prepared()
    found: StoredRead | None = prepared.get("stored")
    if found is None:
        found = prepared["stored"] = StoredRead(_connection())
    return found


def newest_checkpoint(task_id: UUID | str) -> Stored:
    """The task's newest checkpoint and the event that vouches for it: one statement, one round trip."""
    read, connection = stored_read(), _connection()
    prepared = _prepared()
    sql: str | None = prepared.get("stored_alone")
    if sql is None:
        sql = prepared["stored_alone"] = read.alone()
    with hot_cursor() as cursor:
        cursor.execute(sql, [_task_value(task_id, connection)])
        row = cursor.fetchone()
    return Stored(None, None) if row is None else read.load(row)


def load_task(task_id: UUID | str) -> Task | None:
    """``Task.objects.filter(pk=task_id).first()``, without building the query each time."""
    task: Task | None = load("task", lambda pk: Task.objects.filter(pk=pk), task_id)
    return task


def compare_and_set(
    task: Task,
    *,
    expected_version: int,
    from_state: str,
    fields: Sequence[str],
    lease: tuple[int, str] | None = None,
    epoch: int | None = None,
    close: CancelAnswers | None = None,
    release: bool = False,
    inserts: Sequence[models.Model] = (),
) -> bool:
    """Write ``fields`` of ``task`` and bump its version, only if it is still at
    ``expected_version`` in ``from_state`` (and, given ``lease`` = (token,
    worker id), only while that lease is live by the database's clock; given ``epoch``, only while
    the task's ownership epoch is that one: no failover since). True if the row changed.

    On PostgreSQL (``folds()``), in the same statement and only if the row changed: ``close``
    answers the task's open cancel requests, and ``release`` gives ``lease`` up as
    ``tasks.leases.release`` does (both columns at the statement's time). The statement is then
    ``WITH moved AS (UPDATE … RETURNING id), … SELECT count(*) FROM moved``: the count is still
    the compare-and-set's result, and the other writes key on ``moved``, so a refused
    compare-and-set writes nothing at all.

    ``inserts`` (PostgreSQL too): append-only rows (as ``insert`` writes them) added by the same
    statement, each an ``INSERT … SELECT … FROM moved``: inserted only if the row moved. With them,
    a transition's whole commit (the task, its event, checkpoint, outbox rows) is one statement,
    and so, outside a transaction, one round trip.
    """
    release = release and lease is not None
    folding = close is not None or release or bool(inserts)
    if folding and not folds():
        raise ValueError("only PostgreSQL folds writes into the compare-and-set")
    shapes = tuple(type(row) for row in inserts)
    key = ("update", tuple(fields), lease is not None, epoch is not None, close is not None, release, shapes)
    connection, prepared = _connection(), _prepared()
    if key not in prepared:
        table = connection.ops.quote_name(Task._meta.db_table)
        version = _column(Task, "state_version")
        sets = ", ".join(f"{_column(Task, name)} = %s" for name in fields)
        mine = f"{table}.{_column(Task, 'id')}"
        sql = f"UPDATE {table} SET {version} = {table}.{version} + 1, {sets}"
        leases = connection.ops.quote_name(Lease._meta.db_table)
        fence = (
            f"{leases}.{_column(Lease, 'token')} = %s AND {leases}.{_column(Lease, 'worker_id')} = %s"
            f" AND {leases}.{_column(Lease, 'expires_at')} > {_now(connection)}"
        )
        joined = lease is not None and connection.vendor == "postgresql"
        if joined:
            # The fence as a join on the lease's primary key (the task id), not a sub-select: the
            # lease row of this task, at this token, of this holder, live by the database's clock,
            # judged at the statement's start as the sub-select was. (SQLite keeps the sub-select.)
            sql += f" FROM {leases} WHERE {leases}.{_column(Lease, 'task')} = {mine} AND {fence} AND"
        else:
            sql += " WHERE"
        sql += f" {mine} = %s AND {table}.{version} = %s AND {table}.{_column(Task, 'state')} = %s"
        if epoch is not None:
            sql += f" AND {table}.{_column(Task, 'ownership_epoch')} = %s"
        if lease is not None and not joined:
            sql += f" AND EXISTS (SELECT 1 FROM {leases} WHERE {leases}.{_column(Lease, 'task')} = %s"
            sql += f" AND {fence})"
        inserted = [_insert_statement(connection, model) for model in shapes]
        if folding:
            sql = _folded(connection, sql, close=close is not None, release=release, inserts=inserted)
        prepared[key] = (sql, [Task._meta.get_field(name) for name in fields], inserted)
    sql, columns, inserted = prepared[key]
    pk = Task._meta.get_field("id").get_db_prep_value(task.pk, connection)
    params = [field.get_db_prep_save(getattr(task, field.attname), connection) for field in columns]
    joined = lease is not None and connection.vendor == "postgresql"
    if lease is not None and joined:
        params += list(lease)  # token, worker id
    params += [pk, expected_version, from_state]
    if epoch is not None:
        params.append(epoch)
    if lease is not None and not joined:
        params += [pk, *lease]
    if close is not None:
        params += _answer_params(connection, close)
    if release and lease is not None:
        params.append(lease[0])
    for row, (_, row_fields) in zip(inserts, inserted, strict=True):
        params += _insert_params(connection, row, row_fields)
    with hot_cursor() as cursor:
        cursor.execute(sql, params)
        if folding:
            (moved,) = cursor.fetchone()
            return bool(moved == 1)
        updated: int = cursor.rowcount
        return updated == 1


@dataclass(frozen=True)
class CancelAnswers:
    """How a move answers the task's open cancel requests: the ``task`` request one way, the others
    another (``tasks.transitions`` decides which)."""

    own_status: str
    own_resolution: str
    other_status: str
    other_resolution: str
    resolved_at: datetime


def folds() -> bool:
    """Whether this database takes writes folded into the compare-and-set (data-modifying CTEs)."""
    return _connection().vendor == "postgresql"


def _folded(
    connection: BaseDatabaseWrapper,
    update: str,
    *,
    close: bool,
    release: bool,
    inserts: Sequence[tuple[str, list[models.Field[Any, Any]]]] = (),
) -> str:
    """``update`` (the compare-and-set) as a statement that also closes cancel requests and/or
    releases the lease and/or inserts rows, each only for the row it moved; returns the number of
    rows moved."""
    table = connection.ops.quote_name(Task._meta.db_table)
    parts = [f"moved AS ({update} RETURNING {table}.{_column(Task, 'id')})"]
    if close:
        table = connection.ops.quote_name(CancelRequest._meta.db_table)
        scope, status = _column(CancelRequest, "scope"), _column(CancelRequest, "status")
        parts.append(
            f"closed AS (UPDATE {table} SET {status} = CASE WHEN {scope} = %s THEN %s ELSE %s END,"
            f" {_column(CancelRequest, 'resolution')} = CASE WHEN {scope} = %s THEN %s ELSE %s END,"
            f" {_column(CancelRequest, 'resolved_at')} = %s"
            f" WHERE {_column(CancelRequest, 'task')} IN (SELECT {_column(Task, 'id')} FROM moved)"
            f" AND {status} = %s)"
        )
    if release:
        table = connection.ops.quote_name(Lease._meta.db_table)
        now = _now(connection)
        parts.append(
            f"released AS (UPDATE {table} SET {_column(Lease, 'expires_at')} = {now},"
            f" {_column(Lease, 'heartbeat_at')} = {now}"
            f" WHERE {_column(Lease, 'task')} IN (SELECT {_column(Task, 'id')} FROM moved)"
            f" AND {_column(Lease, 'token')} = %s)"
        )
    # Each row only if the task moved: a refused compare-and-set inserts nothing (at most one row moves).
    parts += [f"added{n} AS ({statement} FROM moved)" for n, (statement, _) in enumerate(inserts)]
    return f"WITH {', '.join(parts)} SELECT count(*) FROM moved"


def _answer_params(connection: BaseDatabaseWrapper, close: CancelAnswers) -> list[Any]:
    own = CancelScope.TASK
    resolved_at = CancelRequest._meta.get_field("resolved_at").get_db_prep_save(close.resolved_at, connection)
    return [
        own, close.own_status, close.other_status,
        own, close.own_resolution, close.other_resolution,
        resolved_at, CancelRequest.Status.PENDING,
    ]  # fmt: skip


def _insert_statement(
    connection: BaseDatabaseWrapper, model: type[models.Model]
) -> tuple[str, list[models.Field[Any, Any]]]:
    """``INSERT INTO <model's table> (<every column but a generated id>) SELECT %s, …`` (without its
    ``FROM``), and the fields whose values fill the placeholders: as ``insert`` writes a row.

    Each placeholder is cast to its column's type: bound by the server (``hot_cursor``), a value
    PostgreSQL is not told the type of (None, a string) would be text in a select list, and text is
    not assigned to a uuid or jsonb column. The type without its length (``varchar``, not
    ``varchar(64)``): a cast to the length would cut a long value short, where the column refuses it."""
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.db_returning)]
    columns = ", ".join(_quoted(connection, f) for f in fields)
    placeholders = ", ".join(f"CAST(%s AS {_unsized(f.db_type(connection))})" for f in fields)
    return (
        f"INSERT INTO {connection.ops.quote_name(model._meta.db_table)} ({columns}) SELECT {placeholders}",
        fields,
    )


def _unsized(db_type: str | None) -> str:
    """A column type without its length or precision: ``varchar(64)`` -> ``varchar``."""
    assert db_type, "a concrete field has a column type"
    return re.sub(r"\(\s*\d+\s*(,\s*\d+\s*)?\)", "", db_type)


def _insert_params(
    connection: BaseDatabaseWrapper, obj: models.Model, fields: Sequence[models.Field[Any, Any]]
) -> list[Any]:
    return [field.get_db_prep_save(field.pre_save(obj, True), connection) for field in fields]


def insert(obj: models.Model) -> None:
    """``obj.save(force_insert=True)`` for append-only rows whose id the caller never reads."""
    model = type(obj)
    key = ("insert", model)
    connection, prepared = _connection(), _prepared()
    if key not in prepared:
        fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.db_returning)]
        columns = ", ".join(_quoted(connection, f) for f in fields)
        placeholders = ", ".join(["%s"] * len(fields))
        table = connection.ops.quote_name(model._meta.db_table)
        prepared[key] = (f"INSERT INTO {table} ({columns}) VALUES ({placeholders})", fields)
    sql, fields = prepared[key]
    params = _insert_params(connection, obj, fields)
    with hot_cursor() as cursor:
        cursor.execute(sql, params)
