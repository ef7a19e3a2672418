"""Which database role this connection is, and whether it is the owner
(docs/operating/tamper-evidence.md#database-roles).

``migrate`` runs as the owner role, which owns every table; the application connects as the role
``db_roles`` made, which owns nothing and may not rewrite what a row was created with, history or
roles. The paths that need more (key rotation, retention, role grants, account flags) ask here first
and refuse with the owner's name instead of failing halfway on a permission error.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

# Created by the first migrate, so owned by the role that ran it (the owner of every other table).
OWNED_TABLE = "django_migrations"


@dataclass(frozen=True)
class NotOwner:
    """This connection's role and the owner role it is not (nor a member of)."""

    current: str
    owner: str


def not_owner() -> NotOwner | None:
    """The roles when this connection is not the owner of the tables; None when it is, or on SQLite
    (one file, no roles)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_user, pg_get_userbyid(relowner), pg_has_role(current_user, relowner, 'MEMBER') "
            "FROM pg_class WHERE oid = %s::regclass",
            [OWNED_TABLE],
        )
        current, owner, member = cursor.fetchone()
    return None if member else NotOwner(current=current, owner=owner)


def owner_needed(what: str) -> str | None:
    """A refusal naming the owner role when this connection is not it (``what``: what needs the owner);
    None when it is."""
    roles = not_owner()
    if roles is None:
        return None
    return (
        f"{what} needs the database owner role {roles.owner} (the role that ran migrate); this connection "
        f"is {roles.current}. Run it connected as {roles.owner} "
        "(docs/operating/tamper-evidence.md#database-roles)."
    )
