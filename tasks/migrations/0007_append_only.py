"""On PostgreSQL: checkpoints append-only (bar re-encryption of the body), tasks never deleted.

``tasks_checkpoint``: an UPDATE may change ``body`` only — key rotation
re-encrypts sensitive fields in place, and the digest (of the plaintext form)
and the audit event that records it stay as they were; any other column, a
DELETE or a TRUNCATE is refused. ``tasks_task`` is updated by every transition
but never deleted: a task's events refer to it, and a deleted task would take
its history with it. DELETE and TRUNCATE are refused outside the owner role's
retention path (``append_only_guard``, audit migration 0009, which writes a
tombstone). Note there is no database-level cascade from a task to its events
or checkpoints: Django emulates ``CASCADE``/``PROTECT`` in Python, and the
foreign keys themselves are plain (deferred) constraints, so this trigger is
what refuses a raw ``DELETE FROM tasks_task`` at once.
"""

import importlib

from django.db import migrations

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")

TASK_GUARD = """
DROP TRIGGER IF EXISTS tasks_task_no_delete ON tasks_task;
CREATE TRIGGER tasks_task_no_delete BEFORE DELETE ON tasks_task
    FOR EACH ROW EXECUTE FUNCTION append_only_guard();
DROP TRIGGER IF EXISTS tasks_task_no_truncate ON tasks_task;
CREATE TRIGGER tasks_task_no_truncate BEFORE TRUNCATE ON tasks_task
    FOR EACH STATEMENT EXECUTE FUNCTION append_only_guard();
"""

TASK_UNGUARD = """
DROP TRIGGER IF EXISTS tasks_task_no_delete ON tasks_task;
DROP TRIGGER IF EXISTS tasks_task_no_truncate ON tasks_task;
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard("tasks_checkpoint", "'may_change', 'body'"), params=None)
        schema_editor.execute(TASK_GUARD, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("tasks_checkpoint"), params=None)
        schema_editor.execute(TASK_UNGUARD, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0006_lease_holder_key"),
        ("audit", "0009_append_only_guard"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
