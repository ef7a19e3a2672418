"""manage.py db_roles --app-role NAME [--password-env VAR | --password PW] : the role the app connects as.

Run as the owner role (the one that runs ``migrate`` and owns every table) after
every ``migrate``: it is idempotent, and the column privileges below are per
column, so a column a migration adds is writable by the app only once this ran
again (new tables are covered by default privileges). The owner needs no
superuser: ``CREATEROLE`` (to create the role; on PostgreSQL 16+ also ``ADMIN``
on an existing one, which its creator holds), ownership of the schema's tables,
and ownership of the database (or ``CONNECT`` with grant option). What it
lacks is named in the refusal. Creates the role if missing and leaves it owning
nothing, with exactly:

- ``LOGIN``, no superuser, no CREATEDB / CREATEROLE / REPLICATION / BYPASSRLS
  (an attribute is only altered when it is on: a CREATEROLE owner may not touch
  SUPERUSER, REPLICATION or BYPASSRLS at all on PostgreSQL 15);
- ``CONNECT`` on this database, ``USAGE`` (not ``CREATE``) on its schema;
- ``SELECT, INSERT, UPDATE, DELETE`` on every table of the schema, and
  ``USAGE, SELECT`` on its sequences — now and, by default privileges, for
  tables and sequences the owner creates later;
- less where the app has no business writing:

  - history (``APPEND_ONLY``: no ``UPDATE``/``DELETE``; their triggers refuse it
    anyway), the access log and the money policy's movements included;
  - what a row was created with and the app never rewrites (``WITHHELD``: no
    ``UPDATE`` of those columns, every other column as before): a task's input,
    its ``request_digest``, identity and lineage (owner, parent, rerun, the
    action it compensates: who asked decides who may approve) and the API token
    it was started with (the money policy's per-token total); an approval
    request's copies (consequential, material, digest, evidence, requester,
    policy; who may not decide it, ``barred``, stays writable for escalations
    to extend, and a trigger, approvals migration 0005, refuses removing anyone
    from it); an action's effect and its key scheme. The app's writers move only state columns:
    transitions (state, version, outcome, escalation…), decisions
    (``status``, ``decided_at``), escalation (``approver_role``,
    ``waiting_version``), expiry, dispatch progress;
  - memberships (``OWNER_WRITES``: ``SELECT`` only): roles are granted and
    revoked (``tenancy.services.grant_role`` / ``revoke_role``) by the owner;
  - ``django_migrations``: ``SELECT`` only.

  The paths that rewrite withheld columns run as the owner: key rotation
  (``rotate_keys`` re-seals input, effects and approval copies), retention
  (``retention``: archiving erases them, deleting removes rows), role grants,
  and deleting an account (its memberships go, its tasks and access events
  lose their ``SET_NULL`` link). On ``auth_user`` a trigger (tenancy migration
  0005) refuses the app role any change of ``is_superuser`` or ``is_staff``;
  passwords, ``last_login`` and the rest stay writable.

Without ownership it cannot ``ALTER TABLE`` (so cannot disable a trigger),
``TRUNCATE``, ``DROP`` or grant; the triggers refuse what its privileges
still allow (docs/operating/tamper-evidence.md#database-roles). The command refuses a role that is a
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
from django.db import DatabaseError, connection, transaction

ROLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
TABLE_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
# History the app only appends to: the privilege is withheld as well as refused by a trigger.
APPEND_ONLY = (
    "audit_transitionevent",
    "audit_leasetakeover",
    "audit_tombstone",
    "approvals_approvaldecision",
    "tenancy_accessevent",
    "ledger_moneymovement",
    "ledger_restorerecord",
    "ledger_restoreloss",
    "runtime_modelusage",
)
# Columns the app never updates once the row exists (key rotation and retention run as the owner).
WITHHELD = {
    "tasks_task": (
        "id", "tenant_id", "task_type", "objective", "input", "idempotency_key", "request_digest",
        "created_at", "owner_id", "parent_id", "rerun_of_id", "compensates_id", "api_token_id",
    ),
    "approvals_approvalrequest": (
        "id", "task_id", "tenant_id", "step", "action_step", "consequential", "digest", "material",
        "evidence", "policy_reason", "policy_version", "requested_by", "allowed_decisions", "created_at",
    ),
    "ledger_action": ("effect", "key_scheme"),
    # An orphan effect is kept as the system reported it; only its settlement moves.
    "ledger_orphaneffect": (
        "id", "connector", "idempotency_key", "tenant_id", "found_at", "system_created_at", "system_status",
        "record_id",
    ),
}  # fmt: skip
# Read by the app, written by the owner only.
OWNER_WRITES = ("tenancy_membership", "django_migrations")
# Attributes the app role must not have, in pg_roles' order (SUPERUSER is refused, never altered).
ATTRIBUTES_OFF = ("CREATEDB", "CREATEROLE", "REPLICATION", "BYPASSRLS")
NEEDS = (
    "db_roles needs, as the role running it: CREATEROLE (or superuser) to create or alter the app role, "
    "ownership of the schema's tables, and ownership of the database (or CONNECT WITH GRANT OPTION)"
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
            current = self._refuse_unsafe(cursor, app_role, owner, schema)
            self._refuse_unable(cursor, app_role, owner, schema, exists=current is not None)
            for statement, params in self._statements(app_role, password, schema, database, current):
                try:
                    with transaction.atomic():
                        cursor.execute(statement, params)
                except DatabaseError as exc:
                    shown = statement if not params else statement.replace("%s", "…")
                    raise CommandError(f"{owner} could not run {shown!r}: {exc}. {NEEDS}.") from None
        self.stdout.write(
            f"role {app_role}: DML on the tables of schema {schema} owned by {owner}, no ownership; "
            f"connect the application as {app_role}, run migrate and db_roles as {owner}"
        )

    def _refuse_unable(self, cursor: Any, role: str, owner: str, schema: str, *, exists: bool) -> None:
        """Refuse up front, naming the privilege, what this connection could not do (a GRANT on a table
        it does not own only warns, and would leave the app role without it)."""
        cursor.execute("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")
        superuser, createrole = cursor.fetchone()
        if not (superuser or createrole):
            verb = "alter" if exists else "create"
            raise CommandError(
                f"{owner} has neither CREATEROLE nor SUPERUSER: it cannot {verb} role {role}. {NEEDS}."
            )
        cursor.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relkind IN ('r', 'p', 'S') "
            "AND NOT pg_has_role(current_user, c.relowner, 'USAGE') ORDER BY c.relname",
            [schema],
        )
        foreign = [name for (name,) in cursor.fetchall()]
        if foreign:
            raise CommandError(
                f"{owner} does not own {len(foreign)} tables or sequences of schema {schema} "
                f"(first: {foreign[0]}): run db_roles as the role that ran migrate. {NEEDS}."
            )

    def _refuse_unsafe(self, cursor: Any, role: str, owner: str, schema: str) -> dict[str, bool] | None:
        """Refuse a role the app must not connect as; its attributes that are on (None: no such role)."""
        if role == owner:
            raise CommandError(f"{role} is the role running this command (the owner): pick another name")
        cursor.execute(
            "SELECT rolsuper, pg_has_role(%s, %s, 'MEMBER'), rolcreatedb, rolcreaterole, rolreplication, "
            "rolbypassrls FROM pg_roles WHERE rolname = %s",
            [role, owner, role],
        )
        found = cursor.fetchone()
        if found is None:
            return None
        superuser, member, *flags = found
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
        return dict(zip(ATTRIBUTES_OFF, flags, strict=True))

    def _statements(
        self, role: str, password: str | None, schema: str, database: str, current: dict[str, bool] | None
    ) -> list[tuple[str, list[str]]]:
        q = connection.ops.quote_name
        r, s = q(role), q(schema)
        # Only what is on is turned off: PostgreSQL 15 refuses a CREATEROLE owner any mention of
        # SUPERUSER, REPLICATION or BYPASSRLS, even to say "no".
        off = " ".join(f"NO{name}" for name, on in (current or {}).items() if on)
        statements: list[tuple[str, list[str]]] = [
            (
                f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') "
                f"THEN CREATE ROLE {r}; END IF; END $$",
                [],
            ),
            (f"ALTER ROLE {r} LOGIN NOINHERIT {off}".rstrip(), []),
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
        for table in OWNER_WRITES:
            if table in existing:
                statements.append((f"REVOKE INSERT, UPDATE, DELETE ON {s}.{q(table)} FROM {r}", []))
        for table in APPEND_ONLY:
            if table in existing:
                statements.append((f"REVOKE UPDATE, DELETE ON {s}.{q(table)} FROM {r}", []))
        for table, withheld in WITHHELD.items():
            if table in existing:
                # A table-wide UPDATE covers every column whatever is revoked per column: revoke it, then
                # grant the columns the app moves (every one but the withheld, so new ones are included).
                updatable = [q(column) for column in self._columns(table) if column not in withheld]
                statements.append((f"REVOKE UPDATE ON {s}.{q(table)} FROM {r}", []))
                statements.append((f"GRANT UPDATE ({', '.join(updatable)}) ON {s}.{q(table)} TO {r}", []))
        return statements

    @staticmethod
    def _columns(table: str) -> list[str]:
        with connection.cursor() as cursor:
            return [column.name for column in connection.introspection.get_table_description(cursor, table)]
