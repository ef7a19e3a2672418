"""On PostgreSQL: one guard for every append-only table, TRUNCATE refused, and the retention path.

``append_only_guard()`` is the trigger function every history table uses
(here: transition events, lease takeovers, tombstones; tasks 0007, approvals
0003 and ledger 0004 attach it to checkpoints, tasks, decisions and actions).
Per row, BEFORE UPDATE OR DELETE; per statement, BEFORE TRUNCATE. It refuses:

- UPDATE, unless the trigger's arguments allow it: ``'may_change', col...``
  lets an UPDATE through when only those columns differ (a checkpoint's
  ``body``, re-encrypted in place by key rotation); ``'frozen', col...`` lets
  it through unless one of those columns differs (an action's intent, while
  its dispatch progress moves on);
- DELETE, except on the retention path: the session's role is (a member of)
  the table's owner AND the transaction ran ``SET LOCAL audit.retention =
  'on'``. The application's role owns nothing (``manage.py db_roles``), so the
  setting alone gives it nothing;
- TRUNCATE, except by the owner. Only the owner holds the TRUNCATE privilege
  anyway (the app role is never granted it); this refuses it to any other role
  granted it by mistake. The owner keeps it because it can drop any trigger
  regardless, so refusing it would protect nothing and would break the
  owner's own maintenance (the test suite's flush truncates every table).

Against the owner itself nothing inside the database holds: that is what the
keyed chain and the anchors outside it are for (``audit.anchor``).

The triggers on events and takeovers keep their names from migrations 0002
and 0005 (``<table>_append_only``); the TRUNCATE ones are ``<table>_no_truncate``.
SQLite (the demo) gets none of this, as before.
"""

import importlib

from django.db import migrations

GUARD = """
CREATE OR REPLACE FUNCTION append_only_guard() RETURNS trigger AS $$
DECLARE
    owner name;
    mode text := CASE WHEN TG_NARGS > 0 THEN TG_ARGV[0] ELSE '' END;
    named text[] := CASE WHEN TG_NARGS > 1 THEN TG_ARGV[1:TG_NARGS - 1] ELSE '{}'::text[] END;
    col text;
BEGIN
    SELECT pg_get_userbyid(relowner) INTO owner FROM pg_class WHERE oid = TG_RELID;
    IF TG_OP = 'TRUNCATE' THEN
        IF pg_has_role(current_user, owner, 'MEMBER') THEN
            RETURN NULL;
        END IF;
    ELSIF TG_OP = 'DELETE' THEN
        IF current_setting('audit.retention', true) = 'on' AND pg_has_role(current_user, owner, 'MEMBER') THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION '% is append-only (DELETE refused)', TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'rows leave only on the owner role''s retention path (SET LOCAL audit.retention = on)';
    ELSIF TG_OP = 'UPDATE' AND mode = 'may_change' THEN
        IF to_jsonb(NEW) - named = to_jsonb(OLD) - named THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION '% is append-only (UPDATE refused: only % may change)', TG_TABLE_NAME, named
            USING ERRCODE = 'insufficient_privilege';
    ELSIF TG_OP = 'UPDATE' AND mode = 'frozen' THEN
        FOREACH col IN ARRAY named LOOP
            IF to_jsonb(NEW) -> col IS DISTINCT FROM to_jsonb(OLD) -> col THEN
                RAISE EXCEPTION '% is append-only (UPDATE refused: % may not change)', TG_TABLE_NAME, col
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
        END LOOP;
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% is append-only (% refused)', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""

TABLES = ("audit_transitionevent", "audit_leasetakeover", "audit_tombstone")


def guard(table: str, arguments: str = "") -> str:
    """The two triggers that make ``table`` append-only, ``arguments`` passed to the guard per row."""
    return f"""
DROP TRIGGER IF EXISTS {table}_append_only ON {table};
CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION append_only_guard({arguments});
DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};
CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION append_only_guard();
"""


def unguard(table: str) -> str:
    return f"""
DROP TRIGGER IF EXISTS {table}_append_only ON {table};
DROP TRIGGER IF EXISTS {table}_no_truncate ON {table};
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(GUARD, params=None)
    for table in TABLES:
        schema_editor.execute(guard(table), params=None)
    # The per-table functions of 0002 and 0005, no longer used by any trigger.
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_transitionevent_append_only()", params=None)
    schema_editor.execute("DROP FUNCTION IF EXISTS audit_leasetakeover_append_only()", params=None)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(unguard(table), params=None)
    schema_editor.execute("DROP FUNCTION IF EXISTS append_only_guard()", params=None)
    for name in ("0002_append_only", "0005_lease_takeover_append_only"):
        schema_editor.execute(importlib.import_module(f"audit.migrations.{name}").CREATE, params=None)


class Migration(migrations.Migration):
    dependencies = [("audit", "0008_event_key_id_tombstone")]
    operations = [migrations.RunPython(forwards, backwards)]
