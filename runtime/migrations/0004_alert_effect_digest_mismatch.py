# An alert kind of its own for a task held because an effect was not what was intended
# (runtime.alerts.effect_digest_mismatch): its check constraint lists the kinds.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0003_alertnote_append_only"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="alert",
            name="alert_kind_known",
        ),
        migrations.AlterField(
            model_name="alert",
            name="kind",
            field=models.CharField(
                choices=[
                    ("no_live_lease", "runnable, no worker holds it"),
                    ("wait_past_deadline", "wait past its deadline"),
                    ("unknown_outcome_overdue", "outcome unknown too long"),
                    ("quarantine_overdue", "quarantined too long"),
                    ("cancel_unconfirmed", "cancel not confirmed"),
                    ("effect_digest_mismatch", "effect not as intended, held unsent"),
                ],
                max_length=32,
            ),
        ),
        migrations.AddConstraint(
            model_name="alert",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "kind__in",
                        [
                            "no_live_lease",
                            "wait_past_deadline",
                            "unknown_outcome_overdue",
                            "quarantine_overdue",
                            "cancel_unconfirmed",
                            "effect_digest_mismatch",
                        ],
                    )
                ),
                name="alert_kind_known",
            ),
        ),
    ]
