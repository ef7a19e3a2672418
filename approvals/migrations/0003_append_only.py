"""On PostgreSQL: approval decisions are append-only (no UPDATE, DELETE or TRUNCATE).

A decision is what an approver authorized, bound to the digest they saw; it is
never edited. The request row itself changes status by design and is left
alone. The guard is ``append_only_guard`` (audit migration 0009): only the
owner role's retention path may delete.
"""

import importlib

from django.db import migrations

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard("approvals_approvaldecision"), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("approvals_approvaldecision"), params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0002_direct_object_permissions"),
        ("audit", "0009_append_only_guard"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
