"""The audit search by actor reads ``event_tenant_created`` alone: the index now includes ``actor_id``.

``audit.selectors.search_events`` walks a tenant's events newest first and keeps those whose actor
contains the term. An actor who wrote one event in 200 (a person among workers) made each page fetch
and drop some 10,000 heap rows a tenant, one random page each. With the actor in the index entries
the page's ids come from an index-only scan (a hundred-odd index pages), then only those rows are read.
A rare actor still has the trigram index ``event_actor_trgm`` (0013).

The index keeps its name and keys (tenant, created_at DESC, id DESC), so every other read of it (the
search's other filters, the dashboard's trend) is unchanged. PostgreSQL: the new one is built
``CONCURRENTLY`` under a temporary name, the old one dropped ``CONCURRENTLY`` and the new one renamed
(``atomic = False``), so writers are never blocked. Elsewhere (SQLite, the demo) through the schema
editor, which leaves the included column out.
"""

from __future__ import annotations

from django.db import migrations, models

NAME = "event_tenant_created"
BUILDING = "event_tenant_created_new"
FIELDS = ["tenant", "-created_at", "-id"]


def _old():
    return models.Index(fields=FIELDS, name=NAME)


def _new(name: str = NAME):
    return models.Index(fields=FIELDS, include=["actor_id"], name=name)


def _swap(schema_editor, model, index, building) -> None:
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.remove_index(model, _old() if index.include else _new())
        schema_editor.add_index(model, index)
        return
    sql = str(building.create_sql(model, schema_editor, concurrently=True))
    schema_editor.execute(
        sql.replace("CREATE INDEX CONCURRENTLY", "CREATE INDEX CONCURRENTLY IF NOT EXISTS", 1)
    )
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {NAME}")
    schema_editor.execute(f"ALTER INDEX {BUILDING} RENAME TO {NAME}")


def forwards(apps, schema_editor):
    _swap(schema_editor, apps.get_model("audit", "TransitionEvent"), _new(), _new(BUILDING))


def backwards(apps, schema_editor):
    building = models.Index(fields=FIELDS, name=BUILDING)
    _swap(schema_editor, apps.get_model("audit", "TransitionEvent"), _old(), building)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audit", "0014_event_to_state_index"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveIndex(model_name="transitionevent", name=NAME),
                migrations.AddIndex(model_name="transitionevent", index=_new()),
            ],
            database_operations=[migrations.RunPython(forwards, backwards)],
        ),
    ]
