"""A restore from a backup taken before some tasks existed.

``dump`` and ``restore`` do it for real: ``pg_dump`` of every table but the
sandbox's, then, later, every such table emptied and the dump loaded back
(sequences included), as an operator restoring the task database would.

``forget`` deletes the tasks and every row that refers to them, found through the
schema's foreign keys (whatever table a later change adds), as the owner and past
every guard: no tombstone, no audit event, nothing left that remembers them. The
sandbox's systems keep their own tables, which no foreign key of ours reaches: what
they performed survives, as an external system's records survive our restore.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path

from django.db import connection

SANDBOX_TABLES = "sandbox_*"  # the payment system's own database, which our restore does not reach
MIGRATIONS = "django_migrations"  # the schema is the same before and after: only the data goes back

# (referencing table, its column, referenced table, referenced column) of every single-column FK.
FOREIGN_KEYS = """
SELECT con.conrelid::regclass::text, a.attname, con.confrelid::regclass::text, fa.attname
FROM pg_constraint con
JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = con.conkey[1]
JOIN pg_attribute fa ON fa.attrelid = con.confrelid AND fa.attnum = con.confkey[1]
WHERE con.contype = 'f' AND array_length(con.conkey, 1) = 1
"""
# The single-column primary key of every table that has one.
PRIMARY_KEYS = """
SELECT con.conrelid::regclass::text, a.attname
FROM pg_constraint con
JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = con.conkey[1]
WHERE con.contype = 'p' AND array_length(con.conkey, 1) = 1
"""


def forget(task_ids: Iterable[object]) -> int:
    """Delete ``task_ids`` and everything referring to them (transitively); how many rows went."""
    with connection.cursor() as cursor:
        cursor.execute(FOREIGN_KEYS)
        edges = cursor.fetchall()
        cursor.execute(PRIMARY_KEYS)
        pk = dict(cursor.fetchall())
        # Every row to go, per table, by the values of each column something refers to.
        doomed: dict[str, dict[str, set[object]]] = {"tasks_task": {"id": {str(i) for i in task_ids}}}
        order: list[tuple[str, str, set[object]]] = []
        frontier = [("tasks_task", "id", doomed["tasks_task"]["id"])]
        while frontier:
            table, column, values = frontier.pop()
            order.append((table, column, values))
            for child, child_column, parent, parent_column in edges:
                if parent != table or not values:
                    continue
                if parent_column != column:  # refers to another column of the doomed rows: read it
                    cursor.execute(
                        f"SELECT {parent_column}::text FROM {parent} WHERE {column}::text = ANY(%s)",
                        [list(values)],
                    )
                    keys = {row[0] for row in cursor.fetchall()}
                else:
                    keys = set(values)
                cursor.execute(
                    f"SELECT {pk[child]}::text FROM {child} WHERE {child_column}::text = ANY(%s)",
                    [list(keys)],
                )
                seen = doomed.setdefault(child, {}).setdefault(pk[child], set())
                found = {row[0] for row in cursor.fetchall()} - seen
                if found:
                    seen.update(found)
                    frontier.append((child, pk[child], found))
        # Past every trigger (append-only guards, FK checks): the rows are simply not in the backup.
        cursor.execute("SET session_replication_role = replica")
        try:
            deleted = 0
            for table, column, values in reversed(order):
                cursor.execute(f"DELETE FROM {table} WHERE {column}::text = ANY(%s)", [list(values)])
                deleted += cursor.rowcount
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
    return deleted


def _client_env() -> tuple[list[str], dict[str, str]]:
    """Connection arguments and environment of the libpq tools for the test database."""
    db = connection.settings_dict
    env = {**os.environ, "PGPASSWORD": db.get("PASSWORD") or ""}
    return ["-h", db["HOST"] or "127.0.0.1", "-p", str(db["PORT"] or 5432), "-U", db["USER"]], env


def dump(path: Path) -> Path:
    """A data-only backup of the task database as it is now (every table but the sandbox's)."""
    args, env = _client_env()
    name = connection.settings_dict["NAME"]
    subprocess.run(
        [
            "pg_dump",
            *args,
            "--data-only",
            "--format=custom",
            f"--exclude-table={SANDBOX_TABLES}",
            f"--exclude-table={MIGRATIONS}",
            "-f",
            str(path),
            name,
        ],  # fmt: skip
        check=True,
        env=env,
    )
    return path


def restore(path: Path) -> None:
    """Our tables back to ``path``'s backup: emptied (past every guard) and loaded from it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'"
            " AND tablename NOT LIKE 'sandbox\\_%%' AND tablename <> %s",
            [MIGRATIONS],
        )
        tables = [row[0] for row in cursor.fetchall()]
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(f"TRUNCATE {', '.join(tables)}")
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")
    args, env = _client_env()
    subprocess.run(
        [
            "pg_restore",
            *args,
            "--data-only",
            "--disable-triggers",
            "--exit-on-error",
            "-d",
            connection.settings_dict["NAME"],
            str(path),
        ],  # fmt: skip
        check=True,
        env=env,
    )
