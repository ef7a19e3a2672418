"""Cheaper task writes: fewer index entries per state change, and room on each page for HOT updates.

A transition that changes a task's state rewrites its row with a new entry in every index of
``tasks_task`` (a HOT update, which writes none, needs the indexed columns unchanged and room on the
row's page). Here:

- the foreign keys' own indexes go: ``tenant_id``'s is a prefix of ``task_tenant_id`` (tenant, -id),
  and owner, api token, parent, rerun and compensated action get partial indexes ``WHERE x IS NOT
  NULL`` (``task_<name>``): most tasks have none of them, and ``x = value`` lookups still use them;
- ``fillfactor = 80``: new rows leave a fifth of each page free, so a step commit (state, state
  entry time and reason unchanged: only version, audit head and times move) is a HOT update and
  writes no index entry at all.

PostgreSQL: the indexes are built and dropped ``CONCURRENTLY`` (``atomic = False``), the foreign
key constraints are kept as they are (Django's own AlterField would drop and re-validate them).
Elsewhere (SQLite, the demo) the same indexes through the schema editor; no fillfactor there.
"""

from __future__ import annotations

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

REFERENCES = ("owner", "api_token", "parent", "rerun_of", "compensates")
FILLFACTOR = 80


def _old_index(schema_editor, model, name):
    """The name Django gave a foreign key's own index (``<table>_<column>_<hash>``)."""
    column = model._meta.get_field(name).column
    return schema_editor._create_index_name(model._meta.db_table, [column], suffix="")


def _partial(name):
    return models.Index(fields=[name], condition=models.Q(**{f"{name}__isnull": False}), name=f"task_{name}")


def forwards(apps, schema_editor):
    model = apps.get_model("tasks", "Task")
    postgres = schema_editor.connection.vendor == "postgresql"
    concurrently = " CONCURRENTLY" if postgres else ""
    for name in REFERENCES:
        index = _partial(name)
        if postgres:
            sql = str(index.create_sql(model, schema_editor, concurrently=True))
            schema_editor.execute(
                sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1)
            )
        else:
            schema_editor.add_index(model, index)
    for name in ("tenant", *REFERENCES):
        index = schema_editor.quote_name(_old_index(schema_editor, model, name))
        schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS {index}")
    if postgres:
        schema_editor.execute(f"ALTER TABLE tasks_task SET (fillfactor = {FILLFACTOR})")


def backwards(apps, schema_editor):
    model = apps.get_model("tasks", "Task")
    postgres = schema_editor.connection.vendor == "postgresql"
    concurrently = " CONCURRENTLY" if postgres else ""
    if postgres:
        schema_editor.execute("ALTER TABLE tasks_task RESET (fillfactor)")
    for name in ("tenant", *REFERENCES):
        column = schema_editor.quote_name(model._meta.get_field(name).column)
        index = schema_editor.quote_name(_old_index(schema_editor, model, name))
        schema_editor.execute(f"CREATE INDEX{concurrently} IF NOT EXISTS {index} ON tasks_task ({column})")
    for name in REFERENCES:
        schema_editor.execute(f"DROP INDEX{concurrently} IF EXISTS task_{name}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("ledger", "0008_restore_chain"),
        ("tasks", "0015_task_reason_search"),
        ("tenancy", "0007_shared_saved_views"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="task",
                    name="api_token",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="tenancy.apitoken",
                    ),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="compensates",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="compensation_runs",
                        to="ledger.action",
                    ),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="owner",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="parent",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="children",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="rerun_of",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="reruns",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="task",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="tasks",
                        to="tenancy.tenant",
                    ),
                ),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("owner__isnull", False)), fields=["owner"], name="task_owner"
                    ),
                ),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("api_token__isnull", False)),
                        fields=["api_token"],
                        name="task_api_token",
                    ),
                ),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("parent__isnull", False)), fields=["parent"], name="task_parent"
                    ),
                ),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("rerun_of__isnull", False)),
                        fields=["rerun_of"],
                        name="task_rerun_of",
                    ),
                ),
                migrations.AddIndex(
                    model_name="task",
                    index=models.Index(
                        condition=models.Q(("compensates__isnull", False)),
                        fields=["compensates"],
                        name="task_compensates",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
