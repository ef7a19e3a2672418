"""Task.takeover_head: the head of the task's lease-takeover chain ("" while it has none)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0013_task_api_token'),
    ]

    operations = [
        migrations.AddField(
            model_name='task',
            name='takeover_head',
            field=models.CharField(blank=True, db_default='', default='', max_length=64),
        ),
    ]
