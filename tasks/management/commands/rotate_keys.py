"""manage.py rotate_keys [--batch-size N] [--max-batches N] [--dry-run]

Re-seals every sealed field (``audit.sealing``) that is not under the first key
of ``FIELD_ENCRYPTION_KEYS``, wherever one is kept: checkpoints
(``Checkpoint.body``), the ledger's action effects (``Action.effect``), the
task's ``input`` and ``outcome``, input answers (``TaskInput.payload``),
external events (``ExternalEvent.payload``), and the JSON columns the apps
above register (``sealing.register_json_column``: the approval requests'
``consequential`` and ``material``). The usual rotation: put the new key first
and keep the old one after it, deploy, run this, then remove the old key.

1. Count the rows holding an envelope under another key (one scan per table).
2. Walk them in id order, one batch per transaction: lock the batch's rows,
   re-seal, write back that one column and nothing else (an append-only
   trigger on checkpoints allows only ``body`` to change; tasks, answers,
   events and approval requests have no trigger on UPDATE). A checkpoint's
   digest is over its body with the envelopes blanked, so it — and the audit
   event that recorded it — stays the same; every row is checked for that
   before it is written. Digests of the other columns (a task's
   ``request_digest``, an answer's ``payload_digest``, an approval's
   ``digest``) are of the clear values, which re-sealing does not change.
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

``--dry-run`` changes nothing and prints, per table, how many sealed fields and
rows are under each key id.
"""

from __future__ import annotations

import signal
import time
from argparse import ArgumentParser
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.db import models, transaction
from django.db.models.functions import Cast

from audit import sealing
from ledger.models import Action
from tasks import checkpoints
from tasks.models import Checkpoint, ExternalEvent, Task, TaskInput


def _not_under(primary: str) -> str:
    """A regex (PostgreSQL ARE and Python alike) for JSON text holding an envelope under another key
    (an erased value is under none, and stays as it is).

    Key ids are letters, digits, '_' and '-' (``sealing.KEY_ID``): nothing in one needs escaping.
    """
    return r'"\$sealed":\s*"(?!(' + primary + "|" + sealing.ERASED + ')")'


@dataclass
class Table:
    """One place sealed values live: how to find its rows, and how to re-seal one."""

    label: str
    model: type[models.Model]
    column: str
    pending: Callable[[str], models.QuerySet[Any]]  # rows with an envelope under another key than this
    sealed: Callable[[], models.QuerySet[Any]]  # rows with any envelope
    rotate: Callable[[Any, sealing.Keyring], sealing.Rotated]
    key_ids: Callable[[Any], Counter[str]]


def _checkpoint_rotated(body: str, ring: sealing.Keyring) -> sealing.Rotated:
    result = sealing.rotate_text(body, ring)
    if result.changed and checkpoints.digest(result.value) != checkpoints.digest(body):
        # Cannot happen with envelopes as this code writes them; never write a body its chain would refuse.
        raise CommandError("re-sealing would change a checkpoint's digest: nothing written")
    return result


def json_table(label: str, model: type[models.Model], column: str) -> Table:
    """A JSON column holding envelopes anywhere inside it, found by its text (one scan of the table)."""

    def as_text() -> models.QuerySet[Any]:
        return model._default_manager.alias(sealed_text=Cast(column, models.TextField()))

    return Table(
        label,
        model,
        column,
        pending=lambda primary: as_text().filter(sealed_text__regex=_not_under(primary)),
        sealed=lambda: as_text().filter(sealed_text__contains=f'"{sealing.MARK}"'),
        rotate=sealing.rotate_all,
        key_ids=sealing.key_ids,
    )


CHECKPOINTS = Table(
    "checkpoints",
    Checkpoint,
    "body",
    pending=lambda primary: Checkpoint.objects.filter(body__regex=_not_under(primary)),
    sealed=lambda: Checkpoint.objects.filter(body__contains=f'"{sealing.MARK}"'),
    rotate=_checkpoint_rotated,
    key_ids=sealing.key_ids_in_text,
)


def tables() -> list[Table]:
    """Every place sealed values live, this layer's and below first, then those the apps registered."""
    return [
        CHECKPOINTS,
        json_table("actions", Action, "effect"),
        json_table("task inputs", Task, "input"),
        json_table("task outcomes", Task, "outcome"),
        json_table("answers", TaskInput, "payload"),
        json_table("events", ExternalEvent, "payload"),
        *(json_table(label, model, column) for label, (model, column) in sealing.json_columns().items()),
    ]


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


@dataclass
class Tally:
    rows: int = 0
    resealed: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)


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
        """Re-seal ``table``'s pending rows batch by batch; returns its tally and the batches left.

        Each batch is a keyset page by id, read with its rows locked and written back in one
        transaction: it commits whole, or (an error, a crash) not at all.
        """
        pending = table.pending(ring.primary).order_by("pk").only("pk", table.column)
        tally = Tally()
        total = pending.count()
        if not total:
            return tally, budget
        bar = Bar(self.stderr, table.label, total)
        done, last = 0, 0
        while not self.stopping and budget != 0:
            with transaction.atomic():
                rows = list(pending.filter(pk__gt=last).select_for_update()[:batch_size])
                if not rows:
                    break
                changed = []
                for row in rows:
                    result = table.rotate(getattr(row, table.column), ring)
                    tally.left.update(result.left)
                    if result.changed:
                        setattr(row, table.column, result.value)
                        tally.resealed.update(result.resealed)
                        changed.append(row)
                table.model._default_manager.bulk_update(changed, [table.column])  # that column only
            tally.rows += len(changed)
            done += len(rows)
            last = rows[-1].pk
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
        fields: Counter[str] = Counter()
        rows: Counter[str] = Counter()
        last = 0
        sealed = table.sealed().order_by("pk").only("pk", table.column)
        while batch := list(sealed.filter(pk__gt=last)[:2000]):
            for row in batch:
                found = table.key_ids(getattr(row, table.column))
                fields.update(found)
                rows.update(found.keys())
            last = batch[-1].pk
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
