"""Key rotation: every sealed value re-sealed under the first key of ``FIELD_ENCRYPTION_KEYS``.

Sealed values live in checkpoints (``Checkpoint.body``), the ledger's action effects
(``Action.effect``), the task's ``input`` and ``outcome``, input answers
(``TaskInput.payload``), external events (``ExternalEvent.payload``), and the JSON columns the
apps above register (``sealing.register_json_column``: the approval requests' ``consequential``
and ``material``): ``tables`` lists them. ``rotate_batch`` re-seals one keyset page of one table
in one transaction; ``count_keys`` says what is under each key id. ``manage.py rotate_keys``
drives them (batches, progress, signals, the summary).

A batch locks its rows, re-seals, and writes back that one column and nothing else (an
append-only trigger on checkpoints allows only ``body`` to change; tasks, answers, events and
approval requests have no trigger on UPDATE). A checkpoint's digest is over its body with the
envelopes blanked, so it — and the audit event that recorded it — stays the same; every body is
checked for that before it is written. Digests of the other columns (a task's
``request_digest``, an answer's ``payload_digest``, an approval's ``digest``) are of the clear
values, which re-sealing does not change. A re-sealed row no longer matches ``Table.pending``,
so rotation resumes without remembering anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import models, transaction
from django.db.models.functions import Cast

from audit import sealing
from ledger.models import Action
from tasks import checkpoints
from tasks.models import Checkpoint, ExternalEvent, Task, TaskInput


class RotationRefused(Exception):
    """Re-sealing would have changed what the audit chain vouches for: that batch wrote nothing."""


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
        raise RotationRefused("re-sealing would change a checkpoint's digest: nothing written")
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
    """Every place sealed values live, the kernel's and the ledger's first, then those the apps registered."""
    return [
        CHECKPOINTS,
        json_table("actions", Action, "effect"),
        json_table("task inputs", Task, "input"),
        json_table("task outcomes", Task, "outcome"),
        json_table("answers", TaskInput, "payload"),
        json_table("events", ExternalEvent, "payload"),
        *(json_table(label, model, column) for label, (model, column) in sealing.json_columns().items()),
    ]


@dataclass
class Tally:
    """What rotating one table did: rows rewritten, fields re-sealed and left, by their old key id."""

    rows: int = 0
    resealed: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)


def pending_rows(table: Table, ring: sealing.Keyring) -> models.QuerySet[Any]:
    """``table``'s rows holding a value under another key than the primary, in id order."""
    return table.pending(ring.primary).order_by("pk").only("pk", table.column)


def rotate_batch(table: Table, ring: sealing.Keyring, *, after: Any, size: int, tally: Tally) -> list[Any]:
    """Re-seal the next ``size`` pending rows of ``table`` after the pk ``after``; the pks read, in
    order (empty: none left). ``tally`` counts what was done.

    One transaction, the rows locked: it commits whole or (an error, a crash) not at all. A value
    under a key ``ring`` does not hold stays as it is, counted in ``tally.left``. Raises
    ``RotationRefused`` (nothing of the batch written) when a checkpoint's digest would change.
    """
    with transaction.atomic():
        rows = list(pending_rows(table, ring).filter(pk__gt=after).select_for_update()[:size])
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
    return [row.pk for row in rows]


def count_keys(table: Table) -> tuple[Counter[str], Counter[str]]:
    """How many sealed fields of ``table`` are under each key id, and in how many rows (reads only)."""
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
    return fields, rows
