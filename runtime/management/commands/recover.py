"""manage.py recover [--since ISO] [--apply]: find the effects a restore made our database forget.

Dry run by default: asks every connector that can list for the effects it holds in the window at
risk (``--since``, else from the newest anchor; see ``runtime.recover``) and prints one line per
effect no ledger row explains (``ORPHAN <connector> <key> tenant=<id|-> ...``), then one line per
task the newest anchor names that the restore lost (``LOST <task> tenant=<id> anchored=v<n> now=gone|v<m>``),
then the totals, or says the window holds none. ``--apply`` records each orphan once (a second run
records nothing new), writes the audited restore record per tenant (chained and signed with
``AUDIT_ANCHOR_KEY``: run it where anchors are written) and asks for a fresh anchor. Exits 1 (a
``CommandError``) when nothing says where the window starts, when a system did not answer (the
window was not searched in full: run it again), or when ``--apply`` has no anchor signing key.
A ``WARNING`` line says when the window starts after the restored database's newest transition:
such a run documents no restore for ``verify_audit --against`` (start it earlier).

After a restore: ``recover`` (or ``--since`` a time at or before the backup), read it, the same
with ``--apply``, then start the workers (docs/operating/backup-restore.md).
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
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
        except ImproperlyConfigured as exc:
            raise CommandError(
                f"nothing recorded: the restore record is signed with the anchor key. {exc}"
            ) from None
        for orphan in found.orphans:
            held = orphan.held
            self.stdout.write(
                f"ORPHAN {orphan.connector} {held.key} tenant={orphan.tenant_id or '-'}"
                f" recorded_at={held.created_at.isoformat()} status={held.status} record={held.record_id}"
            )
        for loss in found.losses:
            now = "gone" if loss.version_now is None else f"v{loss.version_now}"
            self.stdout.write(
                f"LOST {loss.task} tenant={loss.tenant} anchored=v{loss.version_anchored} now={now}"
            )
        if found.anchor_problem:
            self.stdout.write(f"NO ANCHOR {found.anchor_problem}")
        if not found.covers_restore and found.restored_to is not None:
            self.stdout.write(
                f"WARNING the window starts after the restored database's newest transition"
                f" ({found.restored_to.isoformat()}): effects in between were not searched, and this run"
                " documents no restore for verify_audit --against; start it at or before that time"
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
        if found.anchor:
            gone = sum(1 for loss in found.losses if loss.version_now is None)
            summary += (
                f"; anchor {found.anchor} names {gone} task(s) the database lost"
                f" and {len(found.losses) - gone} set back"
            )
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
