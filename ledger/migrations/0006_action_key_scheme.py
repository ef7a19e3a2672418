"""An action records how its idempotency key was derived (``ledger.keys.Scheme``), and keeps it.

Every row that exists is ``TASK`` (1), the scheme it was written with: the
database default, so a worker of the older deployment, which does not know the
column, writes 1 too. The column joins the frozen intent (0004): a key's
scheme never changes once the row exists.
"""

import importlib

from django.db import migrations, models

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")
before = importlib.import_module("ledger.migrations.0004_append_only")

INTENT = (*before.INTENT, "key_scheme")


def _guard(columns):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            arguments = ", ".join(["'frozen'", *(f"'{column}'" for column in columns)])
            schema_editor.execute(audit_guard.guard("ledger_action", arguments), params=None)

    return apply


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0005_moneymovement"),
    ]

    operations = [
        migrations.AddField(
            model_name="action",
            name="key_scheme",
            field=models.PositiveSmallIntegerField(db_default=1, default=1),
        ),
        migrations.RunPython(_guard(INTENT), _guard(before.INTENT)),
    ]
