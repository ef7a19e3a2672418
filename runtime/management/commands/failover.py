"""manage.py failover --from R1 --to R2 [--dry-run] [--reason TEXT]: move a region's tasks to another.

Verifies each unfinished task of R1 (its newest checkpoint reads with this
code; no ledger action of it in doubt), moves the ones that pass to R2 with
their ownership epoch bumped (``runtime.failover``): from then on a worker of
R1 that still runs — partitioned, unaware — cannot commit, send or record
anything for them. Prints one line per blocked task with its reason as it is
found, then the totals. Exits 0 when nothing was blocked, 1 (a ``CommandError``)
when some task was: fix what is named (reconcile the action, repair the
checkpoint) and run it again — tasks already moved are not touched twice.
``--dry-run`` verifies and reports without moving anything (same exit status).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.failover import Blocked, check_regions, failover


class Command(BaseCommand):
    help = "Fail a region's unfinished tasks over to another region (verify, bump the epoch, reassign)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--from", dest="from_region", required=True, help="the region losing its tasks")
        parser.add_argument("--to", dest="to_region", required=True, help="the region taking them")
        parser.add_argument("--dry-run", action="store_true", help="verify and report, move nothing")
        parser.add_argument("--reason", default="", help="why (kept in each task's audit event)")

    def handle(
        self, *args: Any, from_region: str, to_region: str, dry_run: bool, reason: str, **options: Any
    ) -> None:
        try:
            check_regions(from_region, to_region)
        except ValueError as exc:
            raise CommandError(str(exc)) from None

        def blocked(task: Blocked) -> None:
            self.stdout.write(f"BLOCKED {task.task_id} [{task.state}] {task.reason}: {task.detail}")

        report = failover(from_region, to_region, reason=reason, dry_run=dry_run, on_blocked=blocked)
        if dry_run:
            summary = f"dry run {from_region} -> {to_region}: {report.verified} verified, would move"
        else:
            moved, skipped = len(report.moved), len(report.skipped)
            summary = (
                f"failover {from_region} -> {to_region}: {report.verified} verified, {moved} moved,"
                f" {skipped} skipped (ended or moved elsewhere meanwhile)"
            )
        self.stdout.write(f"{summary}, {len(report.blocked)} blocked")
        if report.blocked:
            raise CommandError(
                f"{len(report.blocked)} task(s) of {from_region} were not moved (listed above): settle"
                " what is named, then run the failover again"
            )
