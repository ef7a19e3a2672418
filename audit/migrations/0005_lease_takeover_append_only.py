"""On PostgreSQL, refuse UPDATE and DELETE on lease takeover records, as on the transition log.

An operator reads these rows to learn that a task changed hands; a stray script
or admin action must not be able to rewrite or drop that history.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION audit_leasetakeover_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_leasetakeover is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_leasetakeover_append_only
    BEFORE UPDATE OR DELETE ON audit_leasetakeover
    FOR EACH ROW EXECUTE FUNCTION audit_leasetakeover_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_leasetakeover_append_only ON audit_leasetakeover;
DROP FUNCTION IF EXISTS audit_leasetakeover_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0004_checkpoint_digest_and_lease_takeover")]
    operations = [migrations.RunPython(forwards, backwards)]
