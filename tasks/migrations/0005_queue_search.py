"""The console queue's search and age sort.

- ``pg_trgm`` and the trigram GIN index ``task_search_trgm`` on ``UPPER(<search document>)``:
  the expression must stay identical to ``reads.queue.SEARCH_SQL`` (unqualified here), which
  the queue's ``q`` filter compares with ``icontains`` (``UPPER(doc) LIKE UPPER('%term%')``).
  PostgreSQL only: on SQLite (the embedded demo) nothing is created and search scans.
- ``task_tenant_entered`` (tenant, state_entered_at, id): the queue sorted by age in state.

Both are built ``CONCURRENTLY`` on PostgreSQL so a migration on a million-row table does not
block task transitions while it runs (hence ``atomic = False``).
"""

from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations, models

SEARCH_INDEX = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS task_search_trgm ON tasks_task USING gin (
    UPPER(
        REPLACE(CAST("id" AS text), '-', '')
        || ' ' || "objective"
        || ' ' || COALESCE("idempotency_key", '')
        || ' ' || CAST("input" AS text)
    ) gin_trgm_ops
)
"""
ENTERED_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS task_tenant_entered "
    'ON tasks_task ("tenant_id", "state_entered_at", "id")'
)
ENTERED = models.Index(fields=["tenant", "state_entered_at", "id"], name="task_tenant_entered")


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SEARCH_INDEX)
        schema_editor.execute(ENTERED_INDEX)
    else:
        schema_editor.add_index(apps.get_model("tasks", "Task"), ENTERED)


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS task_search_trgm")
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS task_tenant_entered")
    else:
        schema_editor.remove_index(apps.get_model("tasks", "Task"), ENTERED)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0004_task_rerun_of"),
    ]

    operations = [
        TrigramExtension(),  # a no-op outside PostgreSQL
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="task", index=ENTERED)],
            database_operations=[migrations.RunPython(create_indexes, drop_indexes)],
        ),
    ]
