"""manage.py retention [--dry-run] [--list] [--tenant SLUG] [--batch-size N]

Archives and deletes ended tasks as their tenants' retention policies say (``protection.retention``;
docs/operating/retention.md). Beat runs the same function daily (``RETENTION_INTERVAL``).

1. Per tenant, then per page of ``--batch-size`` candidates: decide (archive, delete, keep).
2. Unless ``--dry-run``: archive the page in one transaction, delete in another (with a tombstone
   per task, on the owner role's retention path); progress on stderr after each page.
3. A table on stdout, per tenant and task type: to archive, to delete, held (legal hold), kept
   (a task that stays reruns or descends from it), awaiting the owner; ``--list`` also prints
   every task id acted on, one line each, as it is decided.

The dry run prints exactly what a real run started at the same moment would do. Idempotent: an
archived task is not archived again, a deleted one is gone; a run stopped anywhere lost at most
its open transaction. Archiving and deleting need the database owner role (the application's role
can neither rewrite a task's input nor delete history): run as the app role, it reports what is due
as awaiting the owner. Exit status 1 when a batch was refused (a task that has not ended was in it).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from protection import retention
from tenancy.dbrole import not_owner
from tenancy.models import Tenant

COLUMNS = ("archive", "delete", "held", "kept", "awaiting_owner")


class Command(BaseCommand):
    help = (
        "Archive and delete ended tasks by their tenants' retention policies (--dry-run: say what would go)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="Decide and print; change nothing")
        parser.add_argument("--list", action="store_true", help="Print every task id archived or deleted")
        parser.add_argument("--tenant", default=None, help="Only this tenant (its slug)")
        parser.add_argument("--batch-size", type=int, default=500, help="Tasks per transaction (default 500)")

    def handle(
        self, *args: Any, dry_run: bool, list: bool, tenant: str | None, batch_size: int, **options: Any
    ) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        try:
            report = retention.run(
                dry_run=dry_run,
                tenant=tenant,
                batch_size=batch_size,
                on_item=self._item if list else None,
                on_batch=None if dry_run else self._progress,
            )
        except Tenant.DoesNotExist:
            raise CommandError(f"--tenant {tenant}: no such tenant") from None
        except retention.RetentionRefused as exc:
            raise CommandError(f"refused, that batch changed nothing: {exc}") from None
        self._table(report)

    def _item(self, item: retention.Item) -> None:
        self.stdout.write(
            f"{item.action:<8} {item.task_id}  {item.tenant}/{item.task_type}  "
            f"{item.state} since {item.ended_at:%Y-%m-%d %H:%M}"
        )

    def _progress(self, tenant: str, report: retention.Report) -> None:
        self.stderr.write(
            f"{tenant}: batch {report.batches}, {report.examined} tasks examined; "
            f"{report.archived} archived, {report.deleted} deleted so far"
        )

    def _table(self, report: retention.Report) -> None:
        if report.dry_run:
            self.stdout.write("retention, dry run: what a run now would archive and delete")
        else:
            self.stdout.write("retention: what this run archived and deleted")
        if not report.tallies:
            self.stdout.write("nothing due")
        else:
            header = f"{'tenant':<16} {'task type':<20} {'archive':>7} {'delete':>7} {'held':>5} {'kept':>5} "
            self.stdout.write(header + f"{'owner':>6}  rule")
            for (slug, task_type), tally in sorted(report.tallies.items()):
                counts = [getattr(tally, name) for name in COLUMNS]
                self.stdout.write(
                    f"{slug:<16} {task_type:<20} {counts[0]:>7} {counts[1]:>7} {counts[2]:>5} "
                    f"{counts[3]:>5} {counts[4]:>6}  {tally.rule}"
                )
            self.stdout.write(
                "(held: under a legal hold; kept: a task that stays reruns or descends from it; "
                "owner: deletion due, left for a run as the owner role)"
            )
        if report.dry_run:
            self.stdout.write(
                f"total: {report.total('archive')} to archive, {report.total('delete')} to delete "
                f"({report.total('held')} held, {report.total('kept')} kept for a task that stays)"
            )
        else:
            self.stdout.write(
                f"total: {report.archived} archived, {report.deleted} deleted, in {report.batches} batches"
            )
        waiting = report.total("awaiting_owner")
        if waiting:
            roles = not_owner()
            named = f" {roles.owner} (this connection is {roles.current})" if roles else ""
            self.stderr.write(
                f"{waiting} tasks due for archiving or deletion are left: this connection is not the owner "
                f"of the tables. Run `manage.py retention` as the owner role{named} "
                "(docs/operating/retention.md)."
            )
