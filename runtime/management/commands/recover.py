"""manage.py recover [--since ISO] [--apply]: find the effects a restore made our database forget.

Dry run by default: asks every connector that can list for the effects it holds in the window at
risk (``--since``, else from the newest anchor; see ``runtime.recover``) and prints one line per
effect no ledger row explains (``ORPHAN <connector> <key> tenant=<id|-> ...``), then the totals, or
says the window holds none. ``--apply`` records each orphan once (a second run records nothing
new), writes the audited restore record per tenant and asks for a fresh anchor. Exits 1 (a
``CommandError``) when nothing says where the window starts, or when a system did not answer (the
window was not searched in full: run it again).

After a restore: ``recover --since <backup time>``, read it, ``recover --since <the same> --apply``,
then start the workers.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime import recover


def _moment(value: str) -> datetime:
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--since {value!r} is not an ISO 8601 time") from None


class Command(BaseCommand):
    help = "List (and with --apply record) effects the external systems hold that no ledger row explains."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--since", default="", help="start of the window at risk (ISO 8601, with offset)")
        parser.add_argument("--apply", action="store_true", help="record the orphans (default: dry run)")

    def handle(self, *args: Any, since: str, apply: bool, **options: Any) -> None:
        try:
            found = recover.recover(_moment(since) if since else None, write=apply)
        except (recover.NoWindow, ValueError) as exc:
            raise CommandError(str(exc)) from None
        for orphan in found.orphans:
            held = orphan.held
            self.stdout.write(
                f"ORPHAN {orphan.connector} {held.key} tenant={orphan.tenant_id or '-'}"
                f" recorded_at={held.created_at.isoformat()} status={held.status} record={held.record_id}"
            )
        for name, why in found.not_listing.items():
            self.stdout.write(f"SKIPPED {name}: {why}")
        for name, why in found.unavailable.items():
            self.stdout.write(f"UNAVAILABLE {name}: {why}")
        window = f"window since {found.since.isoformat()}"
        if not found.orphans:
            summary = f"{window}: no orphan effects ({found.listed} effect(s) listed, every one explained)"
        else:
            summary = f"{window}: {len(found.orphans)} orphan effect(s) of {found.listed} listed"
        if apply:
            summary += (
                f"; recorded {found.recorded} new, {found.settled} settled by re-created tasks;"
                " restore recorded, fresh anchor requested"
            )
        else:
            summary += "; dry run, nothing recorded (--apply records them)"
        self.stdout.write(summary)
        if not found.complete:
            raise CommandError(
                f"{', '.join(found.unavailable)} did not answer:"
                " the window was not searched in full; run it again"
            )
