"""manage.py verify_audit [--task ID]... [--against ANCHOR] : check the audit hash chains.

Without ``--against``: every task's chain (or only ``--task``'s), with the keys in
``AUDIT_HMAC_KEYS``: its links (no unkeyed event since the chain was keyed), and that it
is a valid path through the transition table (``tasks.audit_paths``: every move an edge
its actor may take, the states linked, nothing after a terminal state but what the table
allows, no decision without a request), and its lease takeovers as a chain of their own
against the task's ``takeover_head`` (``audit.chain.verify_takeovers``). And, without
``--task``, every tombstone: its seal, and its anchor-key signature
(``audit.verify.tombstone_problems``), so a task a chain-key holder deleted between two
anchors is reported too. Prints the first problem of each damaged task and exits 1 if
any; prints a one-line summary and exits 0 when every chain verifies.

``--against <anchor file or directory>`` (a directory means its newest
anchor) also checks the database against an anchor written by
``audit_anchor`` (``audit.anchor.check_against``): its signature first, then
that every anchored task still exists or has a tombstone signed with an anchor
key (one made with the chain key alone does not count), that its event
at the anchored version still has the anchored hash (a chain recomputed after an
edit, even under the real key, no longer does), that its anchored lease takeover
still exists, and that no tenant has fewer
tasks or events than anchored (deleted tasks, a truncated log). Each problem is
one line on stderr, then exit 1; otherwise one OK line.

Safe on a live system: each chain is read with its task's head in one snapshot
(``tasks.audit_paths.verify_chain``), and a break is re-read before it is printed, so
transitions committing during the run never show up as breaks.
"""

from __future__ import annotations

from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.anchor import Checked, check_against, latest_anchor
from audit.verify import keyed_since, tombstone_problems
from tasks.audit_paths import verify_chain
from tasks.models import Task


class Command(BaseCommand):
    help = "Verify the per-task hash chain of the transition log (and, with --against, an anchor)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--task", action="append", default=[], help="Only this task id (repeatable)")
        parser.add_argument(
            "--against", type=Path, default=None, help="An anchor file, or a directory (its newest anchor)"
        )

    def handle(self, *args: Any, task: list[str], against: Path | None, **options: Any) -> None:
        anchor = self._anchor_path(against) if against is not None else None
        checked = Checked()
        if anchor is not None:
            for problem in check_against(anchor, checked):
                self.stderr.write(f"BROKEN {problem}")
        chains, broken = self._verify_chains(task)
        stones = 0
        for problem in tombstone_problems() if not task else ():
            stones += 1
            self.stderr.write(f"BROKEN {problem}")
        if broken or stones or checked.problems:
            found = [f"{broken} of {chains} task chains are broken"] if broken else []
            if stones:
                found.append(f"{stones} tombstones do not hold up")
            if checked.problems:
                found.append(f"{checked.problems} problems against anchor {anchor}")
            raise CommandError("; ".join(found))
        summary = f"OK: {chains} task chains verified"
        if anchor is not None:
            summary += (
                f"; anchor {anchor.name} ({checked.created_at}) signature valid, {checked.tasks} anchored "
                f"tasks and {checked.tombstones} tombstones match, counts of {checked.tenants} tenants intact"
            )
        self.stdout.write(summary)

    def _anchor_path(self, against: Path) -> Path:
        if against.is_dir():
            newest = latest_anchor(against)
            if newest is None:
                raise CommandError(f"no anchor in {against}")
            return newest
        if not against.is_file():
            raise CommandError(f"no anchor file {against}")
        return against

    def _verify_chains(self, only: list[str]) -> tuple[int, int]:
        # Only ids here: verify_chain reads each head and version with its events, in one snapshot.
        tasks = Task.objects.only("id").order_by("id")
        if only:
            tasks = tasks.filter(id__in=only)
        checked = broken = 0
        keyed = keyed_since()
        for row in tasks.iterator(chunk_size=500):
            checked += 1
            link = verify_chain(row, keyed=keyed)
            if link is not None:
                broken += 1
                self.stderr.write(f"BROKEN {link}")
        return checked, broken
