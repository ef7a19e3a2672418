"""manage.py db_roles --app-role NAME [--password-env VAR | --password PW] : the role the app connects as.

Run as the owner role (the one that runs ``migrate`` and owns every table),
after each ``migrate`` that adds tables is harmless but not needed: default
privileges cover tables the owner creates later. Creates the role if missing
(idempotent otherwise) and leaves it owning nothing, with exactly:

- ``LOGIN``, no superuser, no CREATEDB / CREATEROLE / REPLICATION / BYPASSRLS;
- ``CONNECT`` on this database, ``USAGE`` (not ``CREATE``) on its schema;
- ``SELECT, INSERT, UPDATE, DELETE`` on every table of the schema, and
  ``USAGE, SELECT`` on its sequences — now and, by default privileges, for
  tables and sequences the owner creates later;
- less where a table is history: no ``UPDATE``/``DELETE`` on the append-only
  tables (``APPEND_ONLY``; their triggers refuse it anyway), ``SELECT`` only
  on ``django_migrations``.

Without ownership it cannot ``ALTER TABLE`` (so cannot disable a trigger),
``TRUNCATE``, ``DROP`` or grant; the triggers refuse what its privileges
still allow (README, "Database roles"). The command refuses a role that is a
superuser, is the owner, is a member of the owner, or owns anything.

Prefer ``--password-env`` (the password never appears in the process list);
with neither option an existing password is left as it is.
"""

from __future__ import annotations

import os
import re
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
# History the app only appends to: the privilege is withheld as well as refused by a trigger.
APPEND_ONLY = (
    "audit_transitionevent",
    "audit_leasetakeover",
    "audit_tombstone",
    "approvals_approvaldecision",
)


class Command(BaseCommand):
    help = "Create or update the database role the application connects as (owns nothing)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--app-role", required=True, help="Role name (lower case, letters, digits, _)")
        parser.add_argument("--password", default=None, help="Set this password (visible to ps: avoid)")
        parser.add_argument("--password-env", default=None, help="Set the password from this variable")

    def handle(
        self, *args: Any, app_role: str, password: str | None, password_env: str | None, **options: Any
    ) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("db_roles is for PostgreSQL; the SQLite demo has no roles")
        if not ROLE_NAME.fullmatch(app_role):
            raise CommandError(f"--app-role {app_role!r}: lower-case letters, digits and _, at most 63")
        if password_env is not None:
            password = os.environ.get(password_env)
            if not password:
                raise CommandError(f"--password-env {password_env}: the variable is unset or empty")
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT current_user, current_schema(), current_database()")
            owner, schema, database = cursor.fetchone()
            self._refuse_unsafe(cursor, app_role, owner, schema)
            for statement, params in self._statements(app_role, password, schema, database):
                cursor.execute(statement, params)
        self.stdout.write(
            f"role {app_role}: DML on the tables of schema {schema} owned by {owner}, no ownership; "
            f"connect the application as {app_role}, run migrate and db_roles as {owner}"
        )

    def _refuse_unsafe(self, cursor: Any, role: str, owner: str, schema: str) -> None:
        if role == owner:
            raise CommandError(f"{role} is the role running this command (the owner): pick another name")
        cursor.execute(
            "SELECT rolsuper, pg_has_role(%s, %s, 'MEMBER') FROM pg_roles WHERE rolname = %s",
            [role, owner, role],
        )
        found = cursor.fetchone()
        if found is None:
            return
        superuser, member = found
        if superuser:
            raise CommandError(f"{role} is a superuser: the application role must not be")
        if member:
            raise CommandError(f"{role} is a member of {owner}: it would act as the owner")
        cursor.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_roles r ON r.oid = c.relowner WHERE r.rolname = %s",
            [role],
        )
        (owned,) = cursor.fetchone()
        if owned:
            raise CommandError(
                f"{role} owns {owned} tables or sequences: the application role must own nothing"
            )

    def _statements(
        self, role: str, password: str | None, schema: str, database: str
    ) -> list[tuple[str, list[str]]]:
        q = connection.ops.quote_name
        r, s = q(role), q(schema)
        attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT"
        statements: list[tuple[str, list[str]]] = [
            (
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
                f"THEN CREATE ROLE {r}; END IF; END $$",
                [],
            ),
            (f"ALTER ROLE {r} {attributes}", []),
        ]
        if password is not None:
            statements.append((f"ALTER ROLE {r} PASSWORD %s", [password]))
        statements += [
            (f"GRANT CONNECT ON DATABASE {q(database)} TO {r}", []),
            (f"GRANT USAGE ON SCHEMA {s} TO {r}", []),
            (f"REVOKE CREATE ON SCHEMA {s} FROM {r}", []),
            (f"REVOKE ALL ON ALL TABLES IN SCHEMA {s} FROM {r}", []),
            (f"GRANT {TABLE_PRIVILEGES} ON ALL TABLES IN SCHEMA {s} TO {r}", []),
            (f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {s} TO {r}", []),
            (f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT {TABLE_PRIVILEGES} ON TABLES TO {r}", []),
            (f"ALTER DEFAULT PRIVILEGES IN SCHEMA {s} GRANT USAGE, SELECT ON SEQUENCES TO {r}", []),
        ]
        existing = set(connection.introspection.table_names())
        for table in (*APPEND_ONLY, "django_migrations"):
            if table in existing:
                statements.append((f"REVOKE UPDATE, DELETE ON {s}.{q(table)} FROM {r}", []))
        if "django_migrations" in existing:
            statements.append((f"REVOKE INSERT ON {s}.{q('django_migrations')} FROM {r}", []))
        return statements
