"""Recovery after a restore or a lossy failover: find the effects our database forgot.

A restore from a backup (or a standby promoted without the last commits) loses
tasks whose effects had landed: the authoritative systems keep their own records,
our ledger has no ``Action`` that explains them. ``manage.py recover`` asks every
connector that can list (``Connector.list_since``) for the effects it recorded in
the window at risk, and reports each one no action explains: an orphan
(``ledger.orphans``), with the tenant its key names.

The window starts at ``--since`` when given (the time of the backup restored, or
of the failover); else at the earlier of the newest anchor's time
(``audit.anchor``) and the newest transition the database still has (the restore
point), less ``CLOCK_MARGIN`` for the systems' clocks. Without ``--since`` and
without an anchor it refuses (``NoWindow``): nothing then says how far back the
loss may reach.

What the restore lost is read from the newest anchor in the directory (``audit.anchor.losses_against``):
the tasks it names that the database no longer has, and those now at an older version. Run ``recover``
before the workers and the beat start, so that anchor is still the one written before the restore.

``apply`` (``recover --apply``), in one transaction: the open orphans an action
explains by now are settled by its task; each orphan found is recorded once; one
``RestoreRecord`` per tenant (and one for orphans that name no tenant, and losses of tenants the
database no longer has) says the window, the restore point, how many orphans were found and which
tasks were lost, appended to the restore chain and signed with the anchor key (``ledger.restores``);
and the anchor doorbell rings (``AnchorRequest``), so a fresh anchor soon covers the restored
database and ``verify_audit --against`` a pre-restore anchor reads its losses as a documented restore.
A window that starts after the restore point (``Found.covers_restore``) documents nothing: effects
between the two were not searched.

Refusals: ``NoWindow`` (above); a ``since`` without a UTC offset (``ValueError``); ``apply`` without
``AUDIT_ANCHOR_KEY`` (``ImproperlyConfigured``: nothing written).
A connector that cannot list is skipped and named; one that does not answer is
named as unavailable, and the report says the window was not fully searched.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from django.db import transaction
from django.db.models import Max, QuerySet
from django.utils import timezone

from audit.anchor import AnchorInvalid, Loss, anchor_dir, anchored_at, latest_anchor, losses_against
from audit.models import AnchorRequest, TransitionEvent
from ledger import connectors, orphans, restores
from ledger.connectors.base import ListNotSupported, ListUnavailable
from ledger.models import OrphanEffect, OrphanStatus, RestoreRecord
from tenancy.models import Tenant

# The systems record an effect's time by their own clocks: the window opens this much earlier.
CLOCK_MARGIN = timedelta(minutes=5)
ANCHOR_REASON = "restored"  # the doorbell's reason: a fresh anchor after a recovery


class NoWindow(Exception):
    """Nothing says where the window at risk starts: no ``--since`` and no anchor."""


@dataclass
class Found:
    since: datetime
    orphans: list[orphans.Orphan] = field(default_factory=list)
    listed: int = 0  # effects the systems listed in the window
    not_listing: dict[str, str] = field(default_factory=dict)  # connector -> why it cannot list
    unavailable: dict[str, str] = field(default_factory=dict)  # connector -> why it did not answer
    recorded: int = 0  # with apply: orphans recorded now (the rest were known)
    settled: int = 0  # with apply: open orphans an action explains by now
    restored_to: datetime | None = None  # the restore point: the newest transition the database kept
    anchor: str = ""  # the anchor the losses were read from ("" when none could be)
    anchor_problem: str = ""  # why no anchor was read
    losses: list[Loss] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every connector that can list answered: the window was searched in full."""
        return not self.unavailable

    @property
    def covers_restore(self) -> bool:
        """The window starts at or before the restore point: nothing the restore undid went unsearched."""
        return self.restored_to is None or self.since <= self.restored_to


def window_start(since: datetime | None = None, *, directory: Path | None = None) -> datetime:
    """Where the window at risk starts (see the module's docstring); ``NoWindow`` when nothing says."""
    if since is not None:
        if since.tzinfo is None:
            raise ValueError("--since needs a UTC offset (e.g. 2026-12-01T09:00:00+00:00)")
        return since
    directory = directory or anchor_dir()
    newest = latest_anchor(directory) if directory.is_dir() else None
    if newest is None:
        raise NoWindow(
            f"no window at risk: no --since and no anchor in {directory}; pass --since <ISO time> (when the"
            " restored backup was taken, or when the failover happened)"
        )
    start = anchored_at(newest)
    restore_point = restored_to()
    if restore_point is not None:
        start = min(start, restore_point)
    return start - CLOCK_MARGIN


def restored_to() -> datetime | None:
    """The point the database was restored to, as it shows: its newest transition (None: it has none)."""
    newest: datetime | None = TransitionEvent.objects.aggregate(newest=Max("created_at"))["newest"]
    return newest


def read_losses(found: Found, directory: Path) -> Found:
    """``found`` with the tasks the newest anchor in ``directory`` names as lost (``losses_against``)."""
    newest = latest_anchor(directory) if directory.is_dir() else None
    if newest is None:
        found.anchor_problem = f"no anchor in {directory}: the tasks the restore lost cannot be named"
        return found
    try:
        found.losses = list(losses_against(newest))
    except AnchorInvalid as exc:
        found.anchor_problem = f"anchor {newest.name} not read ({exc}): the tasks lost cannot be named"
        return found
    found.anchor = newest.name
    return found


def find(since: datetime) -> Found:
    """The orphans every connector that can list holds since ``since`` (nothing written)."""
    found = Found(since=since, restored_to=restored_to())
    for name in connectors.names():
        try:
            held = connectors.get(name).list_since(since)
        except ListNotSupported as exc:
            found.not_listing[name] = str(exc)
            continue
        except ListUnavailable as exc:
            found.unavailable[name] = str(exc)
            continue
        found.listed += len(held)
        found.orphans.extend(orphans.orphans_of(name, held))
    return found


def apply(found: Found, *, now: datetime | None = None) -> Found:
    """``found`` recorded (see the module's docstring); the same ``Found``, with what was written."""
    now = now or timezone.now()
    with transaction.atomic():
        found.settled = orphans.settle_explained()
        recorded = orphans.record(found.orphans, now=now)
        found.recorded = len(recorded)
        per_tenant = Counter(o.tenant_id for o in found.orphans)
        new_per_tenant = Counter(row.tenant_id for row in recorded)
        skipped = "; ".join(f"{n}: {why}" for n, why in {**found.not_listing, **found.unavailable}.items())
        tenants: list[int | None] = list(Tenant.objects.order_by("pk").values_list("pk", flat=True))
        lost: dict[int | None, list[Loss]] = {}
        for loss in found.losses:  # a tenant the database no longer has: the record of no tenant
            lost.setdefault(loss.tenant if loss.tenant in tenants else None, []).append(loss)
        if per_tenant[None] or None in lost:
            tenants.append(None)
        restores.append(
            (
                RestoreRecord(
                    tenant_id=tenant,
                    at=now,
                    since=found.since,
                    restored_to=found.restored_to,
                    orphans=per_tenant[tenant],
                    recorded=new_per_tenant[tenant],
                    detail=skipped[:500],
                    anchor=found.anchor,
                ),
                lost.get(tenant, []),
            )
            for tenant in tenants
        )
        AnchorRequest.objects.create(requested_at=now, reason=ANCHOR_REASON)
    return found


def recover(since: datetime | None = None, *, write: bool = False, directory: Path | None = None) -> Found:
    """Find the orphans in the window at risk; with ``write``, record them (``apply``)."""
    directory = directory or anchor_dir()
    found = read_losses(find(window_start(since, directory=directory)), directory)
    return apply(found) if write else found


def open_orphans(tenant_id: int | None = None) -> QuerySet[OrphanEffect]:
    """The orphans not settled yet, newest first (of one tenant when given)."""
    rows = OrphanEffect.objects.filter(status=OrphanStatus.OPEN).order_by("-found_at", "-id")
    return rows if tenant_id is None else rows.filter(tenant_id=tenant_id)
