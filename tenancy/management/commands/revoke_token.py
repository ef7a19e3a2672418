"""manage.py revoke_token PREFIX — revoke the API token whose key starts with PREFIX.

The prefix is what ``drf_create_token`` printed first and the admin lists; a
revoked token answers 401 from its next request on.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from tenancy.models import ApiToken
from tenancy.services import token_revoke


class Command(BaseCommand):
    help = "Revoke an API token by its prefix."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("prefix", help=f"the token's first {ApiToken.PREFIX_LENGTH} characters")

    def handle(self, *args: Any, **options: Any) -> None:
        prefix = options["prefix"][: ApiToken.PREFIX_LENGTH]
        token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
        if token is None or len(options["prefix"]) < ApiToken.PREFIX_LENGTH:
            raise CommandError(f"No token with prefix {options['prefix']!r}.")
        if token_revoke(token):
            self.stdout.write(f"Revoked token {token.prefix} ({token.name or 'unnamed'}) of {token.user}.")
        else:
            self.stdout.write(f"Token {token.prefix} of {token.user} was revoked already.")
