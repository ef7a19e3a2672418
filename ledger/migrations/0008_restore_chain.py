"""Restore records get a chain (prev_hash, hash, key_id; head on RestoreHead), an anchor-key signature,
the restore point, and the tasks the pre-restore anchor showed lost (RestoreLoss, append-only).

Records written before this stay unchained ("" everywhere): verify accepts them only from before this
migration was applied (ledger.restores.CHAINED_MIGRATION).
"""

import django.db.models.deletion
import importlib

from django.db import migrations, models

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard("ledger_restoreloss"), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("ledger_restoreloss"), params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0007_orphan_effects'),
    ]

    operations = [
        migrations.CreateModel(
            name='RestoreHead',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('hash', models.CharField(blank=True, default='', max_length=64)),
            ],
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='anchor',
            field=models.CharField(blank=True, default='', max_length=200),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='key_id',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='losses_digest',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='prev_hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='restored_to',
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='signature',
            field=models.CharField(blank=True, default='', max_length=128),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='signing_key',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='tasks_behind',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.AddField(
            model_name='restorerecord',
            name='tasks_lost',
            field=models.PositiveIntegerField(default=0),
        ),
        migrations.CreateModel(
            name='RestoreLoss',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_id', models.UUIDField()),
                ('version_anchored', models.PositiveIntegerField()),
                ('version_now', models.PositiveIntegerField(blank=True, null=True)),
                ('record', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='losses', to='ledger.restorerecord')),
            ],
            options={
                'indexes': [models.Index(fields=['task_id'], name='restore_loss_task')],
                'constraints': [models.UniqueConstraint(fields=('record', 'task_id'), name='restore_loss_unique')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
