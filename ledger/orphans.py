"""Orphan effects: what an authoritative system holds that no ledger row explains.

After a restore from a backup, or a failover to a standby that lacked the last
commits, our database has forgotten tasks whose effects landed: the system kept
them, our ledger has no ``Action`` with their keys. ``runtime.recover`` lists
them (``Connector.list_since``); this module is what it writes:

- ``explained_keys``: which of a connector's keys some ``Action`` explains (one
  query per chunk of keys).
- ``record``: each orphan once (``OrphanEffect``, unique per connector and key:
  a second run records nothing new), with the tenant its key names
  (``ledger.keys.tenant_of``) when we have that tenant.
- ``settle``: an open orphan whose key a task's action now carries (the task was
  re-created with the client's idempotency key, so it has the same key, and the
  system answered it with its first result) is settled by that task. Called in the
  commit of the step that recorded the deduplicated effect (``runtime.engine``), and
  by ``settle_explained`` for whatever a ledger row explains by the time ``recover``
  runs again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from ledger.connectors.base import Held
from ledger.keys import tenant_of
from ledger.models import Action, OrphanEffect, OrphanStatus
from tenancy.models import Tenant

CHUNK = 1000  # keys per query


@dataclass(frozen=True)
class Orphan:
    """An effect ``connector``'s system holds that no action explains, and whose tenant it names."""

    connector: str
    held: Held
    tenant_id: int | None


def explained_keys(connector: str, keys: Iterable[str]) -> set[str]:
    """The keys among ``keys`` an ``Action`` of ``connector`` carries."""
    keys = list(keys)
    found: set[str] = set()
    for start in range(0, len(keys), CHUNK):
        found.update(
            Action.objects.filter(
                connector=connector, idempotency_key__in=keys[start : start + CHUNK]
            ).values_list("idempotency_key", flat=True)
        )
    return found


def orphans_of(connector: str, held: Iterable[Held]) -> list[Orphan]:
    """Those of ``held`` (what ``connector``'s system holds) no action explains, with their tenants."""
    held = list(held)
    explained = explained_keys(connector, (h.key for h in held))
    named = {tenant for h in held if (tenant := tenant_of(h.key)) is not None}
    known = set(Tenant.objects.filter(pk__in=named).values_list("pk", flat=True))
    return [
        Orphan(connector, h, tenant if (tenant := tenant_of(h.key)) in known else None)
        for h in held
        if h.key not in explained
    ]


def record(orphans: Iterable[Orphan], *, now: datetime | None = None) -> list[OrphanEffect]:
    """Each of ``orphans`` recorded once; the rows recorded now (none for an orphan known already)."""
    now = now or timezone.now()
    recorded = []
    with transaction.atomic():
        for orphan in orphans:
            row, created = OrphanEffect.objects.get_or_create(
                connector=orphan.connector,
                idempotency_key=orphan.held.key,
                defaults={
                    "tenant_id": orphan.tenant_id,
                    "found_at": now,
                    "system_created_at": orphan.held.created_at,
                    "system_status": orphan.held.status[:16],
                    "record_id": orphan.held.record_id[:200],
                },
            )
            if created:
                recorded.append(row)
    return recorded


def settle(connector: str, key: str, task_id: UUID) -> None:
    """The open orphan ``connector``/``key``, if any (most deduplicated effects were never orphans),
    settled by the task ``task_id`` whose action carries that key now."""
    _settle(connector, key, task_id)


def _settle(connector: str, key: str, task_id: UUID) -> int:
    return OrphanEffect.objects.filter(
        connector=connector, idempotency_key=key, status=OrphanStatus.OPEN
    ).update(status=OrphanStatus.SETTLED, settled_task=task_id, settled_at=timezone.now())


def settle_explained() -> int:
    """Every open orphan an action explains by now, settled by that action's task; how many."""
    settled = 0
    open_orphans = OrphanEffect.objects.filter(status=OrphanStatus.OPEN).values_list(
        "connector", "idempotency_key"
    )
    for connector, key in open_orphans.iterator():
        task_id = (
            Action.objects.filter(connector=connector, idempotency_key=key)
            .values_list("task_id", flat=True)
            .first()
        )
        if task_id is not None:
            settled += _settle(connector, key, task_id)
    return settled
