"""On PostgreSQL, refuse UPDATE and DELETE on the transition log.

The hash chain makes tampering detectable; this trigger makes the ordinary
paths (ORM, admin, a stray script) unable to tamper at all. Retention of
terminal tasks' history will get its own, audited path.
"""

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION audit_transitionevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit_transitionevent is append-only (% refused)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER audit_transitionevent_append_only
    BEFORE UPDATE OR DELETE ON audit_transitionevent
    FOR EACH ROW EXECUTE FUNCTION audit_transitionevent_append_only();
"""

DROP = """
DROP TRIGGER IF EXISTS audit_transitionevent_append_only ON audit_transitionevent;
DROP FUNCTION IF EXISTS audit_transitionevent_append_only();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
