"""The money policy's ledger rows (``ledger.money``), and on PostgreSQL: append-only.

A movement is committed with its intent and never changes: only ``api_token_id`` may (set to NULL
when its token is deleted). The indexes serve the running totals and the duplicate-reference read.
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models

audit_guard = importlib.import_module("audit.migrations.0009_append_only_guard")


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.guard("ledger_moneymovement", "'may_change', 'api_token_id'"), params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(audit_guard.unguard("ledger_moneymovement"), params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('ledger', '0004_append_only'),
        ('tenancy', '0004_integrator_api_token'),
        ('audit', '0009_append_only_guard'),
    ]

    operations = [
        migrations.CreateModel(
            name='MoneyMovement',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('task_type', models.CharField(max_length=64)),
                ('requester', models.CharField(blank=True, default='', max_length=200)),
                ('reference', models.CharField(blank=True, default='', max_length=200)),
                ('amount', models.DecimalField(blank=True, decimal_places=8, max_digits=30, null=True)),
                ('currency', models.CharField(blank=True, default='', max_length=16)),
                ('created_at', models.DateTimeField()),
                ('action', models.OneToOneField(on_delete=django.db.models.deletion.PROTECT, related_name='money', to='ledger.action', to_field='idempotency_key')),
                ('api_token', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apitoken')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tenancy.tenant')),
            ],
            options={
                'indexes': [models.Index(fields=['tenant', 'task_type', 'requester', 'currency', 'created_at'], include=('amount',), name='money_by_requester'), models.Index(condition=models.Q(('api_token__isnull', False)), fields=['api_token', 'task_type', 'currency', 'created_at'], include=('amount',), name='money_by_token'), models.Index(condition=models.Q(('reference', ''), _negated=True), fields=['tenant', 'reference', 'created_at'], name='money_by_reference')],
            },
        ),
        migrations.RunPython(forwards, backwards),
    ]
