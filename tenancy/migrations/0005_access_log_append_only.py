"""On PostgreSQL: the access log is append-only, and only the owner role grants staff or superuser.

``tenancy_accessevent`` gets the shared guard (``append_only_guard``, audit
migration 0009), like the audit log: no UPDATE but of ``user_id`` (Django sets
it to NULL when the owner deletes the account; ``username`` keeps the name; the
app role holds no UPDATE on the table at all, ``db_roles``), no DELETE outside
the owner role's retention path, no TRUNCATE but by the owner. Reveals and role
grants stay on record whatever the app role does.

``auth_user`` (the user model's table): ``is_superuser`` and ``is_staff`` are
set by the owner role only (``createsuperuser`` run as the owner). Another role
inserting a user with either set, or changing either, is refused; every other
column (password, ``last_login``, names, ``is_active``) stays the app's to
write, and a full ``save()`` that leaves both as they were passes. A trigger,
not column privileges, for that reason: Django writes every column on a save.
The owner test is the guard's (``pg_has_role(current_user, owner, 'MEMBER')``).
SQLite (the demo) gets none of this.
"""

from django.conf import settings
from django.db import migrations

ACCESS_LOG = "tenancy_accessevent"

ACCESS_LOG_GUARD = f"""
DROP TRIGGER IF EXISTS {ACCESS_LOG}_append_only ON {ACCESS_LOG};
CREATE TRIGGER {ACCESS_LOG}_append_only BEFORE UPDATE OR DELETE ON {ACCESS_LOG}
    FOR EACH ROW EXECUTE FUNCTION append_only_guard('may_change', 'user_id');
DROP TRIGGER IF EXISTS {ACCESS_LOG}_no_truncate ON {ACCESS_LOG};
CREATE TRIGGER {ACCESS_LOG}_no_truncate BEFORE TRUNCATE ON {ACCESS_LOG}
    FOR EACH STATEMENT EXECUTE FUNCTION append_only_guard();
"""

ACCESS_LOG_UNGUARD = f"""
DROP TRIGGER IF EXISTS {ACCESS_LOG}_append_only ON {ACCESS_LOG};
DROP TRIGGER IF EXISTS {ACCESS_LOG}_no_truncate ON {ACCESS_LOG};
"""

PRIVILEGE_GUARD = """
CREATE OR REPLACE FUNCTION user_privilege_guard() RETURNS trigger AS $$
DECLARE
    owner name;
BEGIN
    SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = TG_RELID;
    IF pg_has_role(current_user, owner, 'MEMBER') THEN
        RETURN NEW;
    END IF;
    IF (TG_OP = 'INSERT' AND (NEW.is_superuser OR NEW.is_staff))
        OR (TG_OP = 'UPDATE' AND (NEW.is_superuser IS DISTINCT FROM OLD.is_superuser
                                  OR NEW.is_staff IS DISTINCT FROM OLD.is_staff)) THEN
        RAISE EXCEPTION '%: is_superuser and is_staff are set by the owner role only', TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'run createsuperuser (or the change) connected as the owner role';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
"""


def _user_table(apps) -> str:
    return apps.get_model(settings.AUTH_USER_MODEL)._meta.db_table


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    users = schema_editor.quote_name(_user_table(apps))
    schema_editor.execute(ACCESS_LOG_GUARD, params=None)
    schema_editor.execute(PRIVILEGE_GUARD, params=None)
    schema_editor.execute(
        f"DROP TRIGGER IF EXISTS user_privilege_guard ON {users}; "
        f"CREATE TRIGGER user_privilege_guard BEFORE INSERT OR UPDATE ON {users} "
        f"FOR EACH ROW EXECUTE FUNCTION user_privilege_guard();",
        params=None,
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    users = schema_editor.quote_name(_user_table(apps))
    schema_editor.execute(ACCESS_LOG_UNGUARD, params=None)
    schema_editor.execute(f"DROP TRIGGER IF EXISTS user_privilege_guard ON {users}", params=None)
    schema_editor.execute("DROP FUNCTION IF EXISTS user_privilege_guard()", params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("tenancy", "0004_integrator_api_token"),
        ("audit", "0009_append_only_guard"),  # append_only_guard()
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
