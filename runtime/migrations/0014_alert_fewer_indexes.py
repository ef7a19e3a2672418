"""Two indexes of ``runtime_alert`` that nothing reads: the tenant's own (``alert_tenant_id`` leads with
the tenant) and the acknowledging user's. Each raised alert wrote both; a scan raising 190,000 alerts at
a million tasks wrote 380,000 index entries for nothing."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0013_bulk_snapshot_tenant_ids'),
        ('tenancy', '0007_shared_saved_views'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='alert',
            name='acknowledged_by',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.AlterField(
            model_name='alert',
            name='tenant',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='tenancy.tenant'),
        ),
    ]
