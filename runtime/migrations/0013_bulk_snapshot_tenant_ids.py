"""The tenants a large bulk operation covers, kept beside its snapshot from the confirmation on, so the
auditors of those tenants read its report before a worker has written its results. Snapshots already
waiting get theirs from their own body."""

from django.db import migrations, models

POSTGRESQL_FILL = (
    "UPDATE runtime_bulksnapshot SET tenant_ids = COALESCE("
    "(SELECT jsonb_agg(DISTINCT (e.value->>1)::integer) FROM jsonb_array_elements(body) AS e(value)), "
    "'[]'::jsonb)"
)
SQLITE_FILL = (
    "UPDATE runtime_bulksnapshot SET tenant_ids = "
    "(SELECT json_group_array(DISTINCT json_extract(e.value, '$[1]')) FROM json_each(body) AS e)"
)


def fill(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor in ("postgresql", "sqlite"):
        schema_editor.execute(POSTGRESQL_FILL if vendor == "postgresql" else SQLITE_FILL)


class Migration(migrations.Migration):
    dependencies = [
        ("runtime", "0012_bulk_snapshot"),
    ]

    operations = [
        migrations.AddField(
            model_name="bulksnapshot",
            name="tenant_ids",
            field=models.JSONField(default=list),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
