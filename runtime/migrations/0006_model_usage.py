"""What each model turn cost (``runtime.ModelUsage``), and on PostgreSQL: append-only.

A usage row is committed with the transition after its turn and never changes; it leaves only with
its task, on the owner's retention path. SQLite (the demo) gets no guard, as elsewhere.
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")
TABLE = "runtime_modelusage"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard(TABLE), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard(TABLE), params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0005_alert_orphan_effects_open'),
        ('tasks', '0014_task_takeover_head'),
        ('audit', '0009_append_only_guard'),
    ]

    operations = [
        migrations.CreateModel(
            name='ModelUsage',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('step', models.CharField(max_length=128)),
                ('state_version', models.PositiveIntegerField()),
                ('attempt', models.PositiveIntegerField()),
                ('model_id', models.CharField(max_length=128)),
                ('input_tokens', models.PositiveIntegerField(blank=True, null=True)),
                ('output_tokens', models.PositiveIntegerField(blank=True, null=True)),
                ('cost', models.DecimalField(blank=True, decimal_places=12, max_digits=24, null=True)),
                ('committed', models.BooleanField()),
                ('recorded_at', models.DateTimeField()),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='model_usages', to='tasks.task')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('task', 'state_version'), name='model_usage_one_per_turn')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
