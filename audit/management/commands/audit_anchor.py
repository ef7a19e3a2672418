"""manage.py audit_anchor [--dir DIR] [--if-due] : write a signed anchor of every chain head.

Writes one with ``audit.anchor.write_anchor`` and prints the new file's path and
what it holds. ``--if-due``: only when one is due (``AUDIT_ANCHOR_INTERVAL``
passed since the newest, or a consequential transition asked for one), what
beat polls every minute (``audit.workers.anchor_if_due``); for a cron job
instead of beat. ``--generate-key`` prints a new Ed25519 key pair for ``AUDIT_ANCHOR_KEY`` /
``AUDIT_ANCHOR_PUBLIC_KEYS`` (or ``AUDIT_EXPORT_KEY``) and writes nothing. ``--public-key`` prints the
public keys this host trusts, and its export key's where it has one (PEM, each under a comment with its
fingerprint): what an auditor verifies anchors and signed
exports with (``manage.py verify_export FILE --public-key PATH``, ``scripts/verify_export.py``).
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management.base import BaseCommand

from audit.anchor import anchor_if_due, write_anchor
from audit.keys import anchor_public_keys, encode_private, encode_public, export_public_keys, fingerprint


class Command(BaseCommand):
    help = "Write a signed anchor of every task's audit chain head outside the database."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--dir", type=Path, default=None, help="Directory (default AUDIT_ANCHOR_DIR)")
        parser.add_argument("--generate-key", action="store_true", help="Print a new signing key pair")
        parser.add_argument(
            "--public-key", action="store_true", help="Print the trusted public keys (PEM) for auditors"
        )
        parser.add_argument(
            "--if-due", action="store_true", help="Only if the interval passed or one was asked for"
        )

    def handle(
        self,
        *args: Any,
        dir: Path | None,
        generate_key: bool,
        public_key: bool,
        if_due: bool,
        **options: Any,
    ) -> None:
        if public_key:
            anchors = anchor_public_keys()
            for key_id, public in export_public_keys().items():
                label = "anchor public key" if key_id in anchors else "export public key"
                pem = public.public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
                self.stdout.write(f"# {label} {key_id}\n{pem.decode().strip()}")
            return
        if generate_key:
            private = Ed25519PrivateKey.generate()
            self.stdout.write(f"AUDIT_ANCHOR_KEY={encode_private(private)}")
            self.stdout.write(f"# public key {fingerprint(private.public_key())}, for verifying hosts:")
            self.stdout.write(f"AUDIT_ANCHOR_PUBLIC_KEYS={encode_public(private.public_key())}")
            return
        written = anchor_if_due(dir) if if_due else write_anchor(dir)
        if written is None:
            self.stdout.write("not due: the newest anchor is recent and nothing asked for one")
            return
        self.stdout.write(
            f"{written.path}: {written.tasks} tasks, {written.tombstones} tombstones, "
            f"{written.tenants} tenants"
        )
