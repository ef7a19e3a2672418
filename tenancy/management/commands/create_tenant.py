"""manage.py create_tenant SLUG [--name NAME]

The first step on a fresh production database (``seed_demo`` refuses to run there): a tenant to hold
tasks, then ``grant_role`` for its people and systems, then ``drf_create_token`` for an integrator.
Running it again for an existing slug changes nothing and says so (a deploy script may repeat it).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.core.validators import validate_slug

from tenancy.models import Tenant


class Command(BaseCommand):
    help = "Create a tenant (idempotent): the first step on a fresh production database."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("slug", help="short name in URLs and filters, e.g. acme")
        parser.add_argument("--name", default="", help="display name (default: the slug)")

    def handle(self, *args: Any, slug: str, name: str, **options: Any) -> None:
        try:
            validate_slug(slug)
        except ValidationError:
            raise CommandError(f"{slug!r} is not a slug (letters, digits, - and _)") from None
        tenant, created = Tenant.objects.get_or_create(slug=slug, defaults={"name": name or slug})
        if not created and name and tenant.name != name:
            raise CommandError(f"tenant {slug} exists with the name {tenant.name!r}; change it in /admin/")
        self.stdout.write(f"{'Created' if created else 'Exists:'} tenant {tenant.slug} ({tenant.name})")
