"""The audit search by reason: a trigram GIN index on ``UPPER(reason)`` and ``UPPER(reason_code)``.

``audit.selectors.search_events`` filters ``reason__icontains`` OR ``reason_code__icontains``
(``UPPER(col::text) LIKE UPPER('%term%')``) and pages newest first. Without this index
PostgreSQL has no statistics on those expressions, guesses a handful of matches and reads
every event of the tenant, joins each to its task and sorts them. With it, ``ANALYZE``
collects statistics on both expressions (an expression index gets its own), so a common
term walks ``event_tenant_created`` and stops after one page, and a rare one is a bitmap
scan of this index (BitmapOr of its two columns). The expressions must stay those Django
writes for ``icontains``: ``UPPER("reason")`` (text) and ``UPPER("reason_code"::text)``.

PostgreSQL only, built ``CONCURRENTLY`` (``atomic = False``) so it does not block writers;
on SQLite (the demo) nothing is created and the search scans, as before.
"""

from django.db import migrations

REASON_INDEX = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_reason_trgm ON audit_transitionevent USING gin (
    UPPER("reason") gin_trgm_ops,
    UPPER("reason_code"::text) gin_trgm_ops
)
"""


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REASON_INDEX)
        schema_editor.execute("ANALYZE audit_transitionevent")  # statistics on the new expressions now


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS event_reason_trgm")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audit", "0006_event_search_index"),
        ("tasks", "0005_queue_search"),  # pg_trgm
    ]

    operations = [
        migrations.RunPython(create_index, drop_index),
    ]
