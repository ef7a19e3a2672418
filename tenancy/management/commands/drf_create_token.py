"""manage.py drf_create_token USERNAME [--scopes read,operate] [--expires-days 90] [--name NAME] [--reset]

Creates an API token (``tenancy.ApiToken``) and prints its key once, in the line
scripts already read (``Generated token <key> for user <name>``); only the key's
SHA-256 is stored, so a lost key is replaced, never recovered. The key goes in
``Authorization: Token <key>`` (or ``Bearer <key>``). ``--reset`` revokes the
user's other tokens first. The name is kept from Django REST framework's
command, which this replaces.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from tenancy.models import ApiToken, Scope
from tenancy.services import token_create, token_revoke

DEFAULT_EXPIRY_DAYS = 90
MAX_EXPIRY_DAYS = 3650


class Command(BaseCommand):
    help = "Create an API token for a user (hashed at rest, scoped, expiring) and print its key once."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--scopes",
            default=",".join(Scope.values),
            help=f"comma-separated, of {','.join(Scope.values)} (default: all; the user's roles still apply)",
        )
        parser.add_argument(
            "--expires-days", type=int, default=DEFAULT_EXPIRY_DAYS, help="days until it expires (default 90)"
        )
        parser.add_argument("--name", default="", help="what the token is for, shown beside its prefix")
        parser.add_argument("-r", "--reset", action="store_true", help="revoke the user's other tokens first")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()._default_manager
        try:
            user = users.get_by_natural_key(options["username"])
        except users.model.DoesNotExist:
            raise CommandError(
                f"Cannot create the token: user {options['username']} does not exist"
            ) from None
        days = options["expires_days"]
        if not 1 <= days <= MAX_EXPIRY_DAYS:
            raise CommandError(f"--expires-days must be between 1 and {MAX_EXPIRY_DAYS}")
        if options["reset"]:
            for old in ApiToken.objects.filter(user=user, revoked_at__isnull=True):
                token_revoke(old)
        try:
            token, key = token_create(
                user,
                scopes=options["scopes"],
                name=options["name"],
                expires_at=timezone.now() + timedelta(days=days),
            )
        except ValueError as exc:
            raise CommandError(f"--scopes: {exc}") from None
        self.stdout.write(f"Generated token {key} for user {user.get_username()}")
        # Details on stderr, so the one stdout line stays what scripts parse.
        self.stderr.write(
            f"prefix {token.prefix}, scopes {token.scopes.replace(' ', ',')}, "
            f"expires {token.expires_at:%Y-%m-%d %H:%M UTC}; the key is not stored: it is shown only here"
        )
