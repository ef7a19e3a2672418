"""The audit search by actor: a trigram GIN index on ``UPPER(actor_id)``.

``audit.selectors.search_events`` filters ``actor_id__icontains`` (``UPPER("actor_id"::text) LIKE
UPPER('%term%')``) and pages newest first. An actor who wrote few events (one person among workers)
made PostgreSQL walk ``event_tenant_created`` through every event of the tenant looking for a page of
them. With this index a rare actor is a bitmap scan of the few matching events, and ``ANALYZE``
collects statistics on the expression, so a common actor still walks the ordered index and stops after
one page. The expression must stay the one Django writes for ``icontains`` on a CharField.

PostgreSQL only, built ``CONCURRENTLY`` (``atomic = False``) so it does not block writers; on SQLite
(the demo) nothing is created and the search scans, as before.
"""
from __future__ import annotations

from django.db import migrations

ACTOR_INDEX = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS event_actor_trgm ON audit_transitionevent
USING gin (UPPER("actor_id"::text) gin_trgm_ops)
"""


def create_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ACTOR_INDEX)
        schema_editor.execute("ANALYZE audit_transitionevent")  # statistics on the new expression now


def drop_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP INDEX CONCURRENTLY IF EXISTS event_actor_trgm")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("audit", "0012_verified_through"),
        ("tasks", "0005_queue_search"),  # pg_trgm
    ]

    operations = [
        migrations.RunPython(create_index, drop_index),
    ]
