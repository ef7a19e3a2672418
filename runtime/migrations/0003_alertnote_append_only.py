"""On PostgreSQL: alert notes (acknowledgements and snoozes) are append-only.

``runtime_alertnote`` is the audit record of alert handling: the shared guard
(``append_only_guard``, audit migration 0009) refuses UPDATE, DELETE and
TRUNCATE outside the owner role's retention path. The alerts themselves move
(cleared, acknowledged, snoozed) and are not guarded. SQLite (the demo) gets none of this.
"""

import importlib

from django.db import migrations

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")
TABLE = "runtime_alertnote"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard(TABLE), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard(TABLE), params=None)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0002_alerts"), ("audit", "0009_append_only_guard")]
    operations = [migrations.RunPython(forwards, backwards)]
