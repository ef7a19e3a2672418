"""Retention (tasks.retention): policies per tenant and task type, legal holds, archive records.

On PostgreSQL ``tasks_legalhold`` and ``tasks_archive`` get the append-only guard
(``append_only_guard``, audit migration 0009): a hold changes only by being lifted
(``lifted_by``, ``lift_reason``, ``lifted_at``), an archive record never, and both
leave only with their task on the owner role's retention path. SQLite (the demo):
no triggers, as before. ``tasks_retentionpolicy`` is ordinary, admin-edited data.
"""

import importlib

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")

LIFTED = "'may_change', 'lifted_by', 'lift_reason', 'lifted_at'"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard("tasks_legalhold", LIFTED), params=None)
        schema_editor.execute(audit_guard.guard("tasks_archive"), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("tasks_legalhold"), params=None)
        schema_editor.execute(audit_guard.unguard("tasks_archive"), params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0007_append_only'),
        ('tenancy', '0004_integrator_api_token'),
        ('audit', '0009_append_only_guard'),
    ]

    operations = [
        migrations.CreateModel(
            name='Archive',
            fields=[
                ('task', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='archive', serialize=False, to='tasks.task')),
                ('archived_at', models.DateTimeField()),
                ('rule', models.CharField(max_length=200)),
                ('erased', models.PositiveIntegerField()),
            ],
        ),
        migrations.CreateModel(
            name='LegalHold',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('placed_by', models.CharField(max_length=150)),
                ('reason', models.TextField()),
                ('placed_at', models.DateTimeField()),
                ('lifted_by', models.CharField(blank=True, default='', max_length=150)),
                ('lift_reason', models.TextField(blank=True, default='')),
                ('lifted_at', models.DateTimeField(blank=True, null=True)),
                ('task', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='legal_holds', to='tasks.task')),
            ],
            options={
                'indexes': [models.Index(fields=['task', '-placed_at'], name='legal_hold_task_placed')],
                'constraints': [models.UniqueConstraint(condition=models.Q(('lifted_at__isnull', True)), fields=('task',), name='legal_hold_one_in_force')],
            },
        ),
        migrations.CreateModel(
            name='RetentionPolicy',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_type', models.CharField(blank=True, default='', help_text='Blank: every type of the tenant without its own', max_length=64)),
                ('archive_after_days', models.PositiveIntegerField(blank=True, help_text='Erase sealed values this many days after the task ended; empty: never', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('delete_after_days', models.PositiveIntegerField(blank=True, help_text='Delete the task (leaving a tombstone) this many days after it ended; empty: never', null=True, validators=[django.core.validators.MinValueValidator(1)])),
                ('changed_at', models.DateTimeField(auto_now=True)),
                ('changed_by', models.CharField(blank=True, default='', max_length=150)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tenancy.tenant')),
            ],
            options={
                'verbose_name_plural': 'retention policies',
                'constraints': [models.UniqueConstraint(fields=('tenant', 'task_type'), name='retention_policy_once'), models.CheckConstraint(condition=models.Q(('archive_after_days__isnull', True), ('archive_after_days__gte', 1), _connector='OR'), name='retention_archive_days_positive'), models.CheckConstraint(condition=models.Q(('delete_after_days__isnull', True), ('delete_after_days__gte', 1), _connector='OR'), name='retention_delete_days_positive'), models.CheckConstraint(condition=models.Q(('archive_after_days__isnull', True), ('delete_after_days__isnull', True), ('delete_after_days__gte', models.F('archive_after_days')), _connector='OR'), name='retention_delete_not_before_archive')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
