"""manage.py rotate_keys [--batch-size N] [--max-batches N] [--dry-run]

Re-seals every sealed field (``audit.sealing``) that is not under the first key
of ``FIELD_ENCRYPTION_KEYS``, wherever one is kept (``protection.rotation.tables``:
checkpoints, action effects, task input and outcome, answers, events, and the
columns the apps above register). The usual rotation: put the new key first
and keep the old one after it, deploy, run this, then remove the old key.

1. Count the rows holding an envelope under another key (one scan per table).
2. Walk them in id order, one batch per transaction
   (``protection.rotation.rotate_batch``): lock the batch's rows, re-seal,
   write back that one column and nothing else; checkpoint digests, and so
   the audit chain, stay the same.
3. Report progress on stderr after each batch (rows, rate, time left), and a
   summary on stdout.

Resumable without remembering anything: a re-sealed row no longer matches the
query, so a run stopped anywhere (Ctrl-C, SIGTERM, ``--max-batches``, a crash)
lost at most its open batch, which rolled back; the next run picks up what is
left, and a run with nothing left does nothing. (A transition that read a
task's outcome before its batch may write back the envelope it read: still
under the old key, and picked up by the next run.) SIGTERM and SIGINT stop after
the batch in progress. A value under a key this process does not hold cannot be
re-sealed: it is left as it is and reported (exit status 1), and a task whose
checkpoint holds one is quarantined when a worker loads it.

Re-sealing rewrites columns the application's role may not (``db_roles``): run as any role but
the owner, it stops before the first batch, naming the owner role.

``--dry-run`` (any role) changes nothing and prints, per table, how many sealed fields and
rows are under each key id.
"""

from __future__ import annotations

import signal
import time
from argparse import ArgumentParser
from collections import Counter
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper

from audit import sealing
from protection.rotation import RotationRefused, Table, Tally, count_keys, pending_rows, rotate_batch, tables
from tenancy.dbrole import owner_needed


class Bar:
    """A progress line on stderr: rows done of the total, rate and time left. Redrawn in place on a
    terminal; elsewhere (a log) one line per update."""

    WIDTH = 24

    def __init__(self, stream: OutputWrapper, label: str, total: int) -> None:
        self.stream, self.label, self.total = stream, label, total
        self.started = time.monotonic()
        self.live = stream.isatty()

    def show(self, done: int, fields: int) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        rate = done / elapsed
        left = (self.total - done) / rate if rate and self.total > done else 0.0
        filled = int(self.WIDTH * done / self.total) if self.total else self.WIDTH
        line = (
            f"{self.label:<14} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total} rows, "
            f"{fields} fields, {rate:,.0f} rows/s, ETA {int(left) // 60}:{int(left) % 60:02d}"
        )
        self.stream.write(f"\r{line}" if self.live else line, ending="" if self.live else "\n")
        self.stream.flush()

    def end(self) -> None:
        if self.live:
            self.stream.write("")  # ends the line redrawn in place
            self.stream.flush()


class Command(BaseCommand):
    help = "Re-seal sensitive fields under the first key of FIELD_ENCRYPTION_KEYS (resumable, in batches)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--batch-size", type=int, default=500, help="Rows per transaction (default 500)")
        parser.add_argument(
            "--max-batches", type=int, default=0, help="Stop after this many batches (0: until done)"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count sealed fields per key id; change nothing"
        )

    def handle(self, *args: Any, batch_size: int, max_batches: int, dry_run: bool, **options: Any) -> None:
        if batch_size < 1:
            raise CommandError("--batch-size must be at least 1")
        ring = sealing.keyring()
        if dry_run:
            for table in tables():
                self._count(table, ring)
            return
        refusal = owner_needed("rotate_keys (re-sealing task input, effects and approval copies)")
        if refusal:
            raise CommandError(refusal)
        self.stopping = False
        previous = self._trap_signals()
        try:
            budget = max_batches or None
            tallies = []
            for table in tables():
                tally, budget = self._rotate(table, ring, batch_size, budget)
                tallies.append((table, tally))
                if self.stopping or budget == 0:
                    break
        finally:
            self._restore_signals(previous)
        self._summary(tallies, ring, finished=not self.stopping and budget != 0)

    # --- rotating ---------------------------------------------------------------------------------

    def _rotate(
        self, table: Table, ring: sealing.Keyring, batch_size: int, budget: int | None
    ) -> tuple[Tally, int | None]:
        """Re-seal ``table``'s pending rows batch by batch; returns its tally and the batches left."""
        tally = Tally()
        total = pending_rows(table, ring).count()
        if not total:
            return tally, budget
        bar = Bar(self.stderr, table.label, total)
        done, last = 0, 0
        while not self.stopping and budget != 0:
            try:
                read = rotate_batch(table, ring, after=last, size=batch_size, tally=tally)
            except RotationRefused as exc:
                raise CommandError(str(exc)) from None
            if not read:
                break
            done += len(read)
            last = read[-1]
            bar.show(done, sum(tally.resealed.values()))
            if budget is not None:
                budget -= 1
        bar.end()
        return tally, budget

    def _summary(self, tallies: list[tuple[Table, Tally]], ring: sealing.Keyring, *, finished: bool) -> None:
        for table, tally in tallies:
            moved = ", ".join(f"{key_id}: {n}" for key_id, n in sorted(tally.resealed.items())) or "none"
            self.stdout.write(
                f"{table.label}: {tally.rows} rows re-sealed under {ring.primary!r} (fields from {moved})"
            )
        if not finished:
            self.stdout.write("Stopped before the end: run rotate_keys again to go on.")
            return
        left: Counter[str] = Counter()
        for _, tally in tallies:
            left.update(tally.left)
        if left:
            keys = ", ".join(f"{key_id!r}: {n}" for key_id, n in sorted(left.items()))
            raise CommandError(
                f"{sum(left.values())} sealed fields could not be re-sealed (keys not held, or tokens that "
                f"do not verify) — {keys}. Put the key back in FIELD_ENCRYPTION_KEYS and run again; until "
                "then their tasks are quarantined (checkpoint_undecryptable) when loaded."
            )
        self.stdout.write(f"Done: every sealed field is under {ring.primary!r}.")

    # --- dry run ----------------------------------------------------------------------------------

    def _count(self, table: Table, ring: sealing.Keyring) -> None:
        fields, rows = count_keys(table)
        self.stdout.write(f"{table.label}: {sum(fields.values())} sealed fields")
        for key_id in sorted(fields):
            if key_id == ring.primary:
                note = "current: nothing to do"
            elif key_id == sealing.ERASED:
                note = "erased by retention: nothing to do"
            elif key_id in ring.keys:
                note = "to re-seal"
            else:
                note = "key not held: cannot be re-sealed"
            self.stdout.write(
                f"  {key_id:<32} {fields[key_id]:>9} fields in {rows[key_id]:>9} rows  ({note})"
            )

    # --- signals ----------------------------------------------------------------------------------

    def _trap_signals(self) -> dict[int, Any]:
        """SIGTERM and SIGINT end the run after the batch in progress (commands run in the main thread;
        elsewhere there is nothing to trap)."""

        def stop(signum: int, frame: Any) -> None:
            self.stopping = True

        previous: dict[int, Any] = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                previous[signum] = signal.signal(signum, stop)
            except ValueError:  # not the main thread
                pass
        return previous

    def _restore_signals(self, previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
