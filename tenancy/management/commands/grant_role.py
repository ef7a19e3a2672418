"""manage.py grant_role USERNAME TENANT ROLE [--create-user] [--revoke]

Gives a user a role in a tenant (``tenancy.services.grant_role``: the membership, the tenant's group,
an access-log entry), so a fresh production database gets its approvers, operators, auditors and
integrator systems without the admin or a shell. ``--create-user`` creates the user first, with no
usable password (set one with ``manage.py changepassword USERNAME``; an integrator system needs none,
only a token from ``drf_create_token``). ``--revoke`` takes the role away instead. Idempotent.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from tenancy.models import Role, Tenant
from tenancy.services import grant_role, revoke_role


class Command(BaseCommand):
    help = "Give a user a role in a tenant (or take it away with --revoke)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument("tenant", help="the tenant's slug (manage.py create_tenant)")
        parser.add_argument("role", help=f"one of {', '.join(Role.values)}")
        parser.add_argument("--create-user", action="store_true", help="create the user (no usable password)")
        parser.add_argument("--revoke", action="store_true", help="take the role away")

    def handle(self, *args: Any, username: str, tenant: str, role: str, create_user: bool, revoke: bool,
               **options: Any) -> None:  # fmt: skip
        if role not in Role.values:
            raise CommandError(f"unknown role {role!r}: one of {', '.join(Role.values)}")
        place = Tenant.objects.filter(slug=tenant).first()
        if place is None:
            raise CommandError(f"no tenant {tenant!r}: create it first (manage.py create_tenant {tenant})")
        users = get_user_model()._default_manager
        user = users.filter(**{users.model.USERNAME_FIELD: username}).first()
        if user is None:
            if not create_user or revoke:
                raise CommandError(f"no user {username!r} (add --create-user to create one)")
            user = users.model(**{users.model.USERNAME_FIELD: username})
            user.set_unusable_password()
            user.save()
            self.stderr.write(f"created {username}; set a password: manage.py changepassword {username}")
        if revoke:
            taken = revoke_role(user, place, role)
            self.stdout.write(f"{'Revoked' if taken else 'Had not:'} {username} {role} in {place.slug}")
            return
        grant_role(user, place, role)
        self.stdout.write(f"Granted {username} {role} in {place.slug}")
