"""On PostgreSQL: who may not decide a request (``barred``) only grows, except for the owner role.

The app writes ``barred`` when it raises a request and extends it when an
escalation hands the request on (``approvals.services.Retarget``): it never
removes anyone. A role other than the owner (the app role, ``manage.py
db_roles``) changing it so that an actor or a cause it held is gone is refused:
one ``UPDATE`` must not let the rerunner, the escalator or an earlier decider
decide after all. Adding is allowed (``NEW.barred @> OLD.barred``); a value the
app cannot read refuses everyone anyway (``approvals.authority.refusal``). A
trigger, not a column privilege: the escalation must still write the column.
SQLite (the demo) gets none of this.
"""

from django.db import migrations

TABLE = "approvals_approvalrequest"

GUARD = f"""
CREATE OR REPLACE FUNCTION approval_barred_guard() RETURNS trigger AS $$
DECLARE
    owner name;
BEGIN
    IF NEW.barred @> OLD.barred THEN
        RETURN NEW;
    END IF;
    SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = TG_RELID;
    IF pg_has_role(current_user, owner, 'MEMBER') THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '%: barred only grows (UPDATE refused: it would let someone it names decide)', TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS {TABLE}_barred_grows ON {TABLE};
CREATE TRIGGER {TABLE}_barred_grows BEFORE UPDATE OF barred ON {TABLE}
    FOR EACH ROW EXECUTE FUNCTION approval_barred_guard();
"""

UNGUARD = f"""
DROP TRIGGER IF EXISTS {TABLE}_barred_grows ON {TABLE};
DROP FUNCTION IF EXISTS approval_barred_guard();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(GUARD, params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNGUARD, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0004_barred_from_deciding"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
