"""A restore from a backup taken before some tasks existed, as far as those tasks are concerned.

``forget`` deletes the tasks and every row that refers to them, found through the
schema's foreign keys (whatever table a later change adds), as the owner and past
every guard: no tombstone, no audit event, nothing left that remembers them. The
sandbox's systems keep their own tables, which no foreign key of ours reaches: what
they performed survives, as an external system's records survive our restore.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

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
