"""The queue's ``?reason=`` filter: indexes on a tenant's state reason and outcome reason.

``reads.queue.TaskFilter.filter_reason`` matches ``state_reason = code``, ``state_reason LIKE 'code:%'``
(``cancel`` finds ``cancel:task``) or ``outcome -> 'reason' = code``, newest first. Without an index on
them, a code that few tasks carry — or none, a typo — made PostgreSQL walk ``task_tenant_id`` through
every task of the tenant looking for a page (1.2-1.9 s at a million). With these, ``ANALYZE`` knows how
rare a code is: a rare or unknown one is a BitmapOr of three index ranges (nothing found: nothing read),
and a common one still walks the ordered index and stops after one page.

``varchar_pattern_ops`` serves both the equality and the ``LIKE 'prefix%'`` Django writes
(``"state_reason"::text LIKE``) whatever the database's collation; the outcome's expression is the one
Django writes for ``outcome__reason``. PostgreSQL only, built ``CONCURRENTLY`` (``atomic = False``) so
they do not block writers; on SQLite (the demo) nothing is created and the filter scans, as before.
"""

from __future__ import annotations

from django.db import migrations

INDEXES = {
    "task_tenant_reason": "(tenant_id, state_reason varchar_pattern_ops)",
    "task_tenant_outcome_reason": "(tenant_id, (outcome -> 'reason'))",
}


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name, columns in INDEXES.items():
            schema_editor.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON tasks_task {columns}")
        schema_editor.execute("ANALYZE tasks_task")  # statistics on the outcome's expression now


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in INDEXES:
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0014_task_takeover_head"),
    ]

    operations = [
        migrations.RunPython(create_indexes, drop_indexes),
    ]
