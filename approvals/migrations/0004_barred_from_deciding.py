"""Who may not decide a request (separation of duties across the lineage, issue 20).

``barred``: actor id -> causes (``approvals.authority.Barred``). Requests made
before it hold ``{}``: ``approvals.authority.barred`` still names their
``requested_by``, which is all they barred when they were made.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0003_append_only"),
    ]

    operations = [
        migrations.AddField(
            model_name="approvalrequest",
            name="barred",
            field=models.JSONField(default=dict),
        ),
    ]
