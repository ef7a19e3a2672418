"""manage.py verify_export FILE [--public-key PATH] : check a signed audit export.

The check is ``audit.export_check`` (the same one ``scripts/verify_export.py`` runs with no Django):
each event against its digest, the Ed25519 signature with an anchor public key, and a task export's
chain shape. Keys: the file given, else the ones this host trusts (``AUDIT_ANCHOR_KEY``'s public half
and ``AUDIT_ANCHOR_PUBLIC_KEYS``). Prints ``ok …`` (exit 0), or what fails — the event by its version,
or ``signature`` — and exits 1.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.export_check import KeyFileError, check_file, read_public_keys
from audit.keys import export_public_keys


class Command(BaseCommand):
    help = "Verify a signed audit export (JSON) with the anchor public key."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("file", type=Path, help="The JSON export")
        parser.add_argument(
            "--public-key",
            type=Path,
            default=None,
            help="Public key file (default: the keys this host trusts)",
        )

    def handle(self, *args: Any, file: Path, public_key: Path | None, **options: Any) -> None:
        try:
            keys = read_public_keys(public_key.read_text()) if public_key else export_public_keys()
            outcome = check_file(file, keys)
        except (OSError, KeyFileError) as exc:
            raise CommandError(f"cannot read: {exc}", returncode=2) from None
        if not outcome.ok:
            raise CommandError(outcome.message)
        self.stdout.write(outcome.message)
