"""The queue's search document in a table of its own (``tasks.models.TaskSearch``).

``task_search_trgm`` (migration 0005) indexed ``UPPER(<document>)`` on ``tasks_task`` itself. The
document never changes, but every change of a task's state is a new row version that the index
takes again: one entry per trigram, ~56 for a short task, the bulk of a transition's index writes.
Here the document is written once, to ``tasks_task_search``, by triggers on ``tasks_task``:

- after an insert (any path: the ORM, bulk creates, raw SQL): the document;
- after an update that changes the objective, the idempotency key or the input: the document again
  (nothing the product does today, but a redaction would not leave the old text searchable);
- after a delete: the document goes with its task (a ``TRUNCATE`` of both, as Django's flush does,
  needs nothing more).

Then the existing tasks' documents are copied, the trigram index ``task_search_doc_trgm`` is built on
``UPPER(doc)`` and the old index is dropped, both ``CONCURRENTLY`` (``atomic = False``): writers
are never blocked, and a task created meanwhile has its row from the trigger (the copy skips it).
The document's expression is the one ``reads.queue.SEARCH_SQL`` writes for SQLite, over ``NEW``.
PostgreSQL only: on SQLite (the demo) the table is created and stays empty.
"""

import django.db.models.deletion
from django.db import migrations, models

DOCUMENT = (  # {row}: "NEW.", "t." or "" (the old index's columns, unqualified)
    "REPLACE(CAST({row}id AS text), '-', '') || ' ' || {row}objective"
    " || ' ' || COALESCE({row}idempotency_key, '') || ' ' || CAST({row}input AS text)"
)
FUNCTION = f"""
CREATE OR REPLACE FUNCTION tasks_task_search_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        DELETE FROM tasks_task_search WHERE task_id = OLD.id;
        RETURN OLD;
    END IF;
    INSERT INTO tasks_task_search (task_id, doc) VALUES (NEW.id, {DOCUMENT.format(row="NEW.")})
    ON CONFLICT (task_id) DO UPDATE SET doc = EXCLUDED.doc;
    RETURN NEW;
END
$$
"""
TRIGGERS = (
    "CREATE TRIGGER task_search_insert AFTER INSERT ON tasks_task"
    " FOR EACH ROW EXECUTE FUNCTION tasks_task_search_write()",
    "CREATE TRIGGER task_search_update AFTER UPDATE OF objective, idempotency_key, input ON tasks_task"
    " FOR EACH ROW WHEN (OLD.objective IS DISTINCT FROM NEW.objective"
    " OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key OR OLD.input IS DISTINCT FROM NEW.input)"
    " EXECUTE FUNCTION tasks_task_search_write()",
    "CREATE TRIGGER task_search_delete AFTER DELETE ON tasks_task"
    " FOR EACH ROW EXECUTE FUNCTION tasks_task_search_write()",
)
COPY = (
    f"INSERT INTO tasks_task_search (task_id, doc) SELECT t.id, {DOCUMENT.format(row='t.')}"
    " FROM tasks_task t ON CONFLICT (task_id) DO NOTHING"
)
NEW_INDEX = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS task_search_doc_trgm"
    " ON tasks_task_search USING gin (UPPER(doc) gin_trgm_ops)"
)
OLD_INDEX = f"""
CREATE INDEX CONCURRENTLY IF NOT EXISTS task_search_trgm ON tasks_task USING gin (
    UPPER({DOCUMENT.format(row="")}) gin_trgm_ops
)
"""


def apart(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(FUNCTION)
    for trigger in TRIGGERS:
        schema_editor.execute(trigger)
    schema_editor.execute(COPY)
    schema_editor.execute(NEW_INDEX)
    schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS task_search_trgm")
    schema_editor.execute("ANALYZE tasks_task_search")


def together(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(OLD_INDEX)
    for name in ("task_search_insert", "task_search_update", "task_search_delete"):
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {name} ON tasks_task")
    schema_editor.execute("DROP FUNCTION IF EXISTS tasks_task_search_write()")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0016_reference_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="TaskSearch",
            fields=[
                (
                    "task",
                    models.OneToOneField(
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="tasks.task",
                    ),
                ),
                ("doc", models.TextField()),
            ],
            options={"db_table": "tasks_task_search"},
        ),
        migrations.RunPython(apart, together),
    ]
