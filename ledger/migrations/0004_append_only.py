"""On PostgreSQL: an action's intent is frozen, and actions are never deleted or truncated.

The ledger has no separate history table: an ``Action`` row is the record of
an intended effect, and its dispatch progress (state, attempts, outcome,
timestamps, errors) moves on by design (``ledger.services.action_move``). What
must not change once committed is what was intended and under which key:
``INTENT`` below. ``effect`` is not in it: key rotation re-encrypts its
sensitive fields in place, and ``effect_digest`` (of the effect as sent) binds
its content. A DELETE or TRUNCATE is refused outside the owner role's
retention path (``append_only_guard``, audit migration 0009).
"""

import importlib

from django.db import migrations

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")

INTENT = (
    "id",
    "task_id",
    "step",
    "idempotency_key",
    "connector",
    "effect_digest",
    "compensation_of_id",
    "created_at",
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        arguments = ", ".join(["'frozen'", *(f"'{column}'" for column in INTENT)])
        schema_editor.execute(audit_guard.guard("ledger_action", arguments), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("ledger_action"), params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0003_action_dispatched_at_checked_at"),
        ("audit", "0009_append_only_guard"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
