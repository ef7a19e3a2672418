"""The API token a task was started with (the money policy's running totals per token)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0012_task_compensates'),
        ('tenancy', '0004_integrator_api_token'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='api_token',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='tenancy.apitoken'),
        ),
    ]
