"""The alerts scan's overdue states by age: ``task_alert_overdue`` (state, state_entered_at) where the task
is quarantined, cancel requested or outcome unknown. Without it each of those classifiers read the whole
task table (a sequential scan past every ended task: seconds each at a million tasks, every 30 s).

PostgreSQL: built ``CONCURRENTLY`` (``atomic = False``), so a live table keeps taking writes. Elsewhere
(SQLite, the demo) through the schema editor.
"""

from __future__ import annotations

from django.db import migrations, models

STATES = ["cancel_requested", "outcome_unknown", "quarantined"]  # tasks.models.ALERT_OVERDUE_STATES, sorted


def _index():
    return models.Index(
        fields=["state", "state_entered_at"],
        condition=models.Q(state__in=STATES),
        name="task_alert_overdue",
    )


def forwards(apps, schema_editor):
    model = apps.get_model("tasks", "Task")
    if schema_editor.connection.vendor == "postgresql":
        sql = str(_index().create_sql(model, schema_editor, concurrently=True))
        schema_editor.execute(
            sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1)
        )
    else:
        schema_editor.add_index(model, _index())


def backwards(apps, schema_editor):
    concurrently = " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS task_alert_overdue")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("tasks", "0017_task_search"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="task", index=_index())],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
