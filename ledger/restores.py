"""The restore chain: ``RestoreRecord`` rows that cannot be dropped or edited unseen, and what they excuse.

``runtime.recover`` writes one record per tenant when an operator runs ``recover --apply`` after a
restore; each names the window searched, the orphans found, the point the database was restored to
and the tasks the newest pre-restore anchor showed lost (``RestoreLoss``). ``verify_audit --against``
that anchor (or an older one) then reads the tasks it names as a documented restore, not tampering.

An excuse is only as good as its record, so each is held two ways:

- **Chained** (like lease takeovers, ``audit.chain``): one chain over every record in id order,
  ``hash = HMAC-SHA256(chain key, prev_hash || canonical JSON of the record's fields)``, the first
  linking to ``GENESIS``, the newest's hash on the one ``RestoreHead`` row. A record deleted (the
  newest included) or edited breaks it; so does a loss row deleted or edited, through the record's
  ``losses_digest``. Plain ``verify_audit`` checks it (``problems``).
- **Signed** with the anchor key (``AUDIT_ANCHOR_KEY``, Ed25519), like tombstones
  (``audit.tombstones``), over the same text: the chain key is in every web and worker process, so
  a chain-key holder who deleted tasks could otherwise write a restore record naming them. So
  ``recover --apply`` runs where anchors are written (the owner's maintenance host), and a record
  signed by no trusted anchor key excuses nothing and fails verification.

Records written before ledger migration 0008 carry no chain (``key_id == ""``): accepted from before
it was applied, never after a chained one; they excuse nothing (they name no losses).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.db import transaction

from audit import canonical
from audit.anchor import Finding, Loss
from audit.chain import GENESIS, LEGACY
from audit.keys import anchor_public_keys, anchor_signing_key, chain_keys, current_chain_key, fingerprint
from audit.verify import in_force_since
from ledger.models import RestoreHead, RestoreLoss, RestoreRecord

CHAINED_MIGRATION = ("ledger", "0008_restore_chain")
RECORD = "restore_record"  # named in what is hashed: no restore link passes for an event's or a takeover's
SIGNED_PREFIX = b"durable-agents/restore/v1\n"
HASHED_FIELDS = (
    "tenant_id",
    "at",
    "since",
    "restored_to",
    "orphans",
    "recorded",
    "detail",
    "anchor",
    "tasks_lost",
    "tasks_behind",
    "losses_digest",
)
HEAD_ID = 1
# What a loss excuses: the anchored task's being gone only if the restore lost it outright; the rest
# (set back, its anchored event gone or rewritten by the work redone since) for a loss of either kind.
GONE = "gone"
SET_BACK = ("behind", "event_missing", "event_differs")
TAKEOVER = "takeover_missing"


def losses_digest(losses: Iterable[Any]) -> str:
    """SHA-256 of the canonical list of ``(task id, anchored version, version now)``, by task id."""
    rows = sorted([str(loss.task_id), loss.version_anchored, loss.version_now] for loss in losses)
    return canonical.digest(rows, version=canonical.V1)


def _text(prev_hash: str, record: RestoreRecord) -> bytes:
    covered = {name: getattr(record, name) for name in HASHED_FIELDS} | {"record": RECORD}
    return (prev_hash + canonical.dumps(covered, version=canonical.V1)).encode()


def _link(prev_hash: str, record: RestoreRecord, secret: bytes) -> str:
    return hmac.new(secret, _text(prev_hash, record), hashlib.sha256).hexdigest()


def append(records: Iterable[tuple[RestoreRecord, list[Loss]]]) -> list[RestoreRecord]:
    """Insert ``records`` (unsaved, each with its losses) at the end of the chain; the saved records.

    In the caller's transaction, under the head row's lock, so two runs append one after the other.
    Raises ``ImproperlyConfigured`` without ``AUDIT_ANCHOR_KEY``: nothing is written then.
    """
    private, key = anchor_signing_key(), current_chain_key()
    signer = fingerprint(private.public_key())
    saved: list[RestoreRecord] = []
    with transaction.atomic():
        head, _ = RestoreHead.objects.select_for_update().get_or_create(pk=HEAD_ID)
        prev = head.hash or GENESIS
        for record, losses in records:
            rows = [
                RestoreLoss(
                    task_id=loss.task, version_anchored=loss.version_anchored, version_now=loss.version_now
                )
                for loss in losses
            ]
            record.tasks_lost = sum(1 for loss in losses if loss.version_now is None)
            record.tasks_behind = len(losses) - record.tasks_lost
            record.losses_digest = losses_digest(rows)
            record.prev_hash, record.key_id = prev, key.id
            record.hash = _link(prev, record, key.secret)
            record.signing_key = signer
            record.signature = base64.b64encode(private.sign(SIGNED_PREFIX + _text(prev, record))).decode()
            record.save()
            for row in rows:
                row.record = record
            RestoreLoss.objects.bulk_create(rows)
            saved.append(record)
            prev = record.hash
        head.hash = prev
        head.save(update_fields=["hash"])
    return saved


def _own_problem(
    record: RestoreRecord,
    losses: list[RestoreLoss],
    keys: dict[str, bytes],
    trusted: dict[str, Ed25519PublicKey],
) -> str | None:
    """Why ``record`` alone is not what ``recover --apply`` wrote (its link, signature, losses); or None."""
    secret = keys.get(record.key_id)
    if secret is None:
        return f"keyed with key id {record.key_id!r}, which AUDIT_HMAC_KEYS does not hold"
    if not hmac.compare_digest(_link(record.prev_hash, record, secret).encode(), record.hash.encode()):
        return "contents do not match the stored hash (edited, or written without the chain key)"
    public = trusted.get(record.signing_key)
    if public is None:
        return f"signed by key {record.signing_key!r}, which is not a trusted anchor key"
    try:
        public.verify(
            base64.b64decode(record.signature, validate=True), SIGNED_PREFIX + _text(record.prev_hash, record)
        )
    except (InvalidSignature, binascii.Error, ValueError):
        return "its anchor-key signature does not match its contents"
    if losses_digest(losses) != record.losses_digest:
        return "the tasks it names as lost differ from what it recorded (a loss row deleted or edited)"
    return None


@dataclass
class Verified:
    """The restore chain read and checked: its problems, and the records that hold up on their own."""

    problems: list[str] = field(default_factory=list)
    records: list[RestoreRecord] = field(default_factory=list)  # chained and intact, in id order
    losses: dict[int, list[RestoreLoss]] = field(default_factory=dict)  # by record id
    count: int = 0


def verify() -> Verified:
    """Check every restore record, in id order, against the chain, the head, the keys and its losses.

    A record that fails on its own is reported and left out of ``records``; a break between records
    (one deleted or reordered) is reported while the intact ones stay usable, each being signed.
    """
    result = Verified()
    keys, trusted = chain_keys(), anchor_public_keys()
    records = list(RestoreRecord.objects.order_by("id"))
    result.count = len(records)
    by_record: dict[int, list[RestoreLoss]] = defaultdict(list)
    for loss in RestoreLoss.objects.order_by("id"):
        by_record[loss.record_id].append(loss)
    head = RestoreHead.objects.filter(pk=HEAD_ID).values_list("hash", flat=True).first() or ""
    chained_since: datetime | None = None
    if any(record.key_id == LEGACY for record in records):
        chained_since = in_force_since(CHAINED_MIGRATION)
    prev, seen_chained = GENESIS, False
    for record in records:
        at = f"restore record #{record.pk} ({record.at:%Y-%m-%d %H:%M:%S} UTC, tenant {record.tenant_id})"
        if record.key_id == LEGACY:
            if seen_chained or (chained_since is not None and record.at >= chained_since):
                result.problems.append(f"{at}: unchained, but written after restore records were chained")
            continue
        problem = _own_problem(record, by_record[record.pk], keys, trusted)
        if problem is not None:
            result.problems.append(f"{at}: {problem}")
        else:
            result.records.append(record)
            result.losses[record.pk] = by_record[record.pk]
        if record.prev_hash != prev:
            result.problems.append(
                f"{at}: prev_hash does not match the previous record (one deleted or moved)"
            )
        prev, seen_chained = record.hash, True
    if (prev if seen_chained else "") != head:
        result.problems.append("the restore chain's head does not match its newest record (a record deleted)")
    return result


@dataclass
class Documented:
    """One ``recover --apply`` run as the excuses read it: every tenant's record of that moment."""

    at: datetime
    since: datetime
    tasks_lost: int = 0
    tasks_behind: int = 0
    orphans: int = 0
    excused: int = 0  # findings against the anchor it explained

    def __str__(self) -> str:
        return (
            f"documented restore: {self.at.isoformat()}, window since {self.since.isoformat()}, "
            f"{self.tasks_lost} tasks lost, {self.tasks_behind} set back, {self.orphans} orphans found"
        )


class Excuses:
    """What the verified restore records written after an anchor explain of its findings (``Excuse``).

    A record counts when it was written at or after the anchor and its window starts at or before the
    point the database was restored to (so it searched the whole time the restore undid). A task
    finding is excused when such a record of the same tenant names the task as lost (gone, for a task
    now gone; gone or set back below the anchored version otherwise); a tenant's count shortfall
    when the tasks (and their events) those records name as gone cover it. Nothing else is excused:
    a tenant changed, tombstones, the keying moment.
    """

    def __init__(self, verified: Verified, anchored_at: datetime) -> None:
        self.runs: dict[datetime, Documented] = {}
        self._losses: dict[str, tuple[RestoreRecord, RestoreLoss]] = {}
        self._short: dict[tuple[int | None, str], int] = defaultdict(int)
        for record in verified.records:  # id order: a later record's loss of a task replaces an earlier
            if record.at < anchored_at or (
                record.restored_to is not None and record.since > record.restored_to
            ):
                continue
            run = self.runs.setdefault(record.at, Documented(at=record.at, since=record.since))
            run.tasks_lost += record.tasks_lost
            run.tasks_behind += record.tasks_behind
            run.orphans += record.orphans
            for loss in verified.losses[record.pk]:
                self._losses[str(loss.task_id)] = (record, loss)
        for record, loss in self._losses.values():
            self._short[(record.tenant_id, "tasks_count")] += loss.version_now is None
            self._short[(record.tenant_id, "events_count")] += loss.version_anchored - (loss.version_now or 0)

    def __call__(self, finding: Finding) -> bool:
        record = self._explainer(finding)
        if record is not None:
            self.runs[record.at].excused += 1
        return record is not None

    def _explainer(self, finding: Finding) -> RestoreRecord | None:
        if finding.kind in ("tasks_count", "events_count"):
            explained = self._short[(finding.tenant, finding.kind)]
            if not explained or finding.short > explained:
                return None
            return next(r for r, _ in reversed(self._losses.values()) if r.tenant_id == finding.tenant)
        if finding.task is None or finding.task not in self._losses:
            return None
        record, loss = self._losses[finding.task]
        if record.tenant_id not in (finding.tenant, None):  # None: losses of a tenant no longer here
            return None
        if finding.kind == GONE:
            return record if loss.version_now is None else None
        if finding.kind in SET_BACK:
            below = loss.version_now is None or finding.version is None or loss.version_now < finding.version
            return record if below else None
        return record if finding.kind == TAKEOVER else None

    def used(self) -> Iterator[Documented]:
        """The restores that explained something, oldest first."""
        return (run for at, run in sorted(self.runs.items()) if run.excused)
