"""manage.py verify_audit [--task ID]... [--against ANCHOR] : check the audit hash chains.

Without ``--against``: every task's chain (or only ``--task``'s), with the keys in
``AUDIT_HMAC_KEYS``: its links (no unkeyed event since the chain was keyed), and that it
is a valid path through the transition table (``tasks.audit_paths``: every move an edge
its actor may take, the states linked, nothing after a terminal state but what the table
allows, no decision without a request), and its lease takeovers as a chain of their own
against the task's ``takeover_head`` (``audit.chain.verify_takeovers``). And, without
``--task``, every tombstone: its seal, and its anchor-key signature
(``audit.verify.tombstone_problems``), so a task a chain-key holder deleted between two
anchors is reported too; and the restore chain (``ledger.restores``): every record
``recover --apply`` wrote, linked, signed with an anchor key and naming the losses it
recorded, its newest one on the head, so a restore record deleted or edited (or forged
without the anchor key) is reported. Prints the first problem of each damaged task and
exits 1 if any; prints a one-line summary (with the restore records verified, when any) and
exits 0 when every chain verifies.

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

After a restore, what the restore undid is not tampering: a restore record that verifies,
written at or after the anchor, whose window starts at or before the point the database
was restored to, and that names the task as lost (``ledger.restores.Excuses``), explains
that task's being gone or set back, and the tenant counts those losses account for. Each
such restore is printed on stdout (``documented restore: <when>, window since <since>,
N tasks lost, K set back, M orphans found``) and, with nothing else wrong, the command
exits 0 with its OK line saying how many findings the restores explained. Everything else
still fails: a task whose chain no longer verifies, a task missing or set back that no
restore record names, a restore record that does not verify (then it explains nothing),
a task moved to another tenant.

Safe on a live system: each chain is read with its task's head in one snapshot
(``tasks.audit_paths.verify_chain``), and a break is re-read before it is printed, so
transitions committing during the run never show up as breaks.
"""

from __future__ import annotations

from argparse import ArgumentParser
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from audit.anchor import AnchorInvalid, Checked, check_against, check_signature, latest_anchor
from audit.verify import keyed_since, tombstone_problems
from ledger import restores
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
        restore_chain = restores.verify() if anchor is not None or not task else None
        checked = Checked()
        excuses = (
            self._excuses(anchor, restore_chain) if anchor is not None and restore_chain is not None else None
        )
        if anchor is not None:
            for problem in check_against(anchor, checked, excuse=excuses):
                self.stderr.write(f"BROKEN {problem}")
        for documented in excuses.used() if excuses is not None else ():
            self.stdout.write(f"{documented} ({documented.excused} finding(s) against the anchor explained)")
        chains, broken = self._verify_chains(task)
        stones = 0
        for problem in tombstone_problems() if not task else ():
            stones += 1
            self.stderr.write(f"BROKEN {problem}")
        restore_problems = restore_chain.problems if restore_chain is not None else []
        for problem in restore_problems:
            self.stderr.write(f"BROKEN {problem}")
        if broken or stones or checked.problems or restore_problems:
            found = [f"{broken} of {chains} task chains are broken"] if broken else []
            if stones:
                found.append(f"{stones} tombstones do not hold up")
            if restore_problems:
                found.append(f"{len(restore_problems)} problems in the restore chain")
            if checked.problems:
                found.append(f"{checked.problems} problems against anchor {anchor}")
            raise CommandError("; ".join(found))
        summary = f"OK: {chains} task chains verified"
        if anchor is not None:
            summary += (
                f"; anchor {anchor.name} ({checked.created_at}) signature valid, {checked.tasks} anchored "
                f"tasks and {checked.tombstones} tombstones match, counts of {checked.tenants} tenants intact"
            )
            if checked.excused:
                summary += f" but for {checked.excused} finding(s) a documented restore explains"
        if restore_chain is not None and restore_chain.count and not task:
            summary += f"; restore chain of {restore_chain.count} record(s) intact"
        self.stdout.write(summary)

    def _excuses(self, anchor: Path, chain: restores.Verified) -> restores.Excuses | None:
        """What the verified restore records explain against ``anchor``; None when its signature fails
        (``check_against`` reports that, and nothing else of an untrusted anchor is read)."""
        try:
            header = check_signature(anchor)
        except AnchorInvalid:
            return None
        return restores.Excuses(chain, datetime.fromisoformat(str(header["created_at"])))

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
