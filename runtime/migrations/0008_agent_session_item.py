"""Agents' conversation memory (``runtime.AgentSessionItem``), and on PostgreSQL: items never rewritten.

An item is appended and leaves by ``pop`` or ``clear`` (a DELETE, which the application does itself),
or with its task on retention's path; an UPDATE may change only ``item``, which key rotation re-seals
and archiving erases. The guard is the append-only one of audit migration 0009 on UPDATE alone.
SQLite (the demo) gets no guard, as elsewhere.
"""

import django.db.models.deletion
from django.db import migrations, models

import tasks.ids

TABLE = "runtime_agentsessionitem"
GUARD = f"""
DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE};
CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION append_only_guard('may_change', 'item');
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(GUARD, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only ON {TABLE}", params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0007_agent_runs'),
        ('tasks', '0014_task_takeover_head'),
        ('tenancy', '0006_second_factor_kinds'),
        ('audit', '0009_append_only_guard'),
    ]

    operations = [
        migrations.CreateModel(
            name='AgentSessionItem',
            fields=[
                ('id', models.UUIDField(default=tasks.ids.uuid7, editable=False, primary_key=True, serialize=False)),
                ('session_id', models.CharField(max_length=200)),
                ('position', models.PositiveIntegerField()),
                ('item', models.JSONField()),
                ('created_at', models.DateTimeField()),
                ('task', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.PROTECT, related_name='session_items', to='tasks.task')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tenancy.tenant')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('tenant', 'session_id', 'position'), name='agent_session_item_position')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
