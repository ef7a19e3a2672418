"""Lease takeovers get a keyed chain per task: prev_hash, hash, key_id (audit.chain.verify_takeovers).

Rows written before this stay unchained ("" everywhere): verify accepts them only from before this
migration was applied (audit.verify.TAKEOVERS_CHAINED_MIGRATION).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('audit', '0010_anchor_doorbell_signed_tombstones'),
    ]

    operations = [
        migrations.AddField(
            model_name='leasetakeover',
            name='hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
        migrations.AddField(
            model_name='leasetakeover',
            name='key_id',
            field=models.CharField(blank=True, default='', max_length=32),
        ),
        migrations.AddField(
            model_name='leasetakeover',
            name='prev_hash',
            field=models.CharField(blank=True, default='', max_length=64),
        ),
    ]
