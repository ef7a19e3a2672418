"""Anchors: signed copies of every chain head, kept outside the database.

The keyed chain (``audit.chain``) stops anyone without ``AUDIT_HMAC_KEYS``
from rewriting history, but a database owner who also holds that key (or
simply deletes a task with its events, or truncates the log) is not stopped by
anything inside the database. An anchor is what such an owner cannot reach: a
file, written periodically (``manage.py audit_anchor``; beat polls
``anchor_if_due`` every minute) to ``AUDIT_ANCHOR_DIR``, listing for every
task its tenant, version and chain head (and, once it was taken over, its
lease-takeover head: ``takeover_head``), every tombstone, and per tenant the
count of tasks and events. ``verify_audit --against <anchor>`` then finds a
task whose anchored event no longer has the anchored hash (an edit, even with
the chain recomputed under the real key), a task gone without a tombstone, and
counts that went down (deletion, TRUNCATE). A task is accounted for only by a
tombstone signed with the anchor key (``audit.tombstones``): the chain key,
which every app process holds, cannot make one.

How often: ``anchor_if_due`` writes an anchor when the newest one in the
directory is ``AUDIT_ANCHOR_INTERVAL`` seconds old (default 900), or sooner
when a consequential transition rang the doorbell since (an ``AnchorRequest``
row: an approval decided, an effect committed to, a task completed or its
outcome reconciled, a task deleted by retention; ``tasks.audit_paths``). The
beat polls it every 60 seconds, so such a commit is anchored within about a
minute and anything else within the interval. Until then, events are covered
by the chain key only: a key holder can append to them (within the transition
table) or delete them with an anchor-key-less tombstone that the next anchor
does not account for. Whether the next anchor is due is read from the
directory, not the database, so rows the database's owner plants cannot
postpone it; deleting doorbell rows only falls back to the interval. Each run
writes an ``AnchorRun`` row, which the console's integrity badge shows
(display only: verification reads the signed files).

File: JSON Lines, UTF-8. A header line, one line per task (keyset order of
id), one per tombstone, one per tenant, and a last line with the signature.
Written to a temporary name, then hard-linked to its final name (which fails
rather than replace an existing file: no run overwrites another), then made
read-only. Put the directory where the database's owner cannot write: another
host's mount, a WORM volume, or a directory synced to object storage with
object lock. Size: about 150 bytes per task per run.

Signature: Ed25519 over ``"durable-agents/audit-anchor/v1\\n" + sha256(hex)``
of every byte before the signature line. Why Ed25519 rather than an HMAC key:
whoever can check an HMAC can also make one, so every place that verifies
anchors (an auditor's laptop, a monitor on another host, a CI job replaying
old anchors) would hold the power to forge them. With Ed25519 only the writer
(the beat process) holds ``AUDIT_ANCHOR_KEY``; verifiers hold public keys
(``AUDIT_ANCHOR_PUBLIC_KEYS``) that cannot sign. One signature per run costs
nothing, and ``cryptography`` is already a dependency. The signing key is kept
apart from the chain keys: leaking one does not forge the other.

Scale: tasks are read in keyset-ordered chunks of ``CHUNK`` rows inside one
read-only REPEATABLE READ snapshot (PostgreSQL), so the file describes one
moment and memory stays flat however many tasks there are; verification
streams the file twice (signature, then checks) and queries per chunk.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from django.conf import settings
from django.db import connection
from django.db.models import Count, Q, Sum
from django.utils import timezone

from audit.keys import anchor_public_keys, anchor_signing_key, chain_keys, fingerprint
from audit.models import AnchorRequest, AnchorRun, LeaseTakeover, Tombstone, TransitionEvent
from audit.tombstones import tombstone_problem
from audit.verify import keyed_since, snapshot

FORMAT = "durable-agents/audit-anchor"
FORMAT_VERSION = 1
SIGNED_PREFIX = b"durable-agents/audit-anchor/v1\n"
CHUNK = 1000  # tasks per query, writing and verifying
SUFFIX = ".jsonl"

# What checks a tombstone: the chain keys by id, the anchor public keys by fingerprint (audit.keys).
Keys = tuple[dict[str, bytes], dict[str, Ed25519PublicKey]]
# The task model through our own foreign key: audit sits below tasks and does not import it.
Task: Any = TransitionEvent._meta.get_field("task").related_model


def anchor_dir() -> Path:
    return Path(settings.AUDIT_ANCHOR_DIR)


def _line(record: dict[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="microseconds")


# --- Writing --------------------------------------------------------------------------------------


@dataclass
class Written:
    path: Path
    tasks: int = 0
    tombstones: int = 0
    tenants: int = 0


def _task_chunks(chunk: int) -> Iterator[list[tuple[Any, int, int, str, str]]]:
    """Every task's (id, tenant id, version, head, takeover head), ``chunk`` rows per query, in id order
    (keyset)."""
    rows = Task._default_manager.order_by("id").values_list(
        "id", "tenant_id", "state_version", "audit_head", "takeover_head"
    )
    after = None
    while True:
        page = list((rows.filter(id__gt=after) if after is not None else rows)[:chunk])
        if page:
            yield page
        if len(page) < chunk:
            return
        after = page[-1][0]


def _tombstone_chunks(chunk: int) -> Iterator[list[Tombstone]]:
    after = 0
    while True:
        page = list(Tombstone.objects.filter(id__gt=after).order_by("id")[:chunk])
        if page:
            yield page
        if len(page) < chunk:
            return
        after = page[-1].id


def tenant_counts() -> dict[int, dict[str, int]]:
    """Per tenant: tasks, events, tombstones and the events tombstoned tasks had (their last version).

    Read tasks and events before tombstones: a retention commit in between is then counted twice
    (higher), never missed, when this runs outside one snapshot.
    """
    counts: dict[int, dict[str, int]] = {}

    def slot(tenant_id: int) -> dict[str, int]:
        return counts.setdefault(
            tenant_id, {"tasks": 0, "events": 0, "tombstones": 0, "tombstoned_events": 0}
        )

    for row in Task._default_manager.values("tenant_id").annotate(n=Count("id")).order_by():
        slot(row["tenant_id"])["tasks"] = row["n"]
    for row in TransitionEvent.objects.values("tenant_id").annotate(n=Count("id")).order_by():
        slot(row["tenant_id"])["events"] = row["n"]
    for row in (
        Tombstone.objects.values("tenant_id").annotate(n=Count("id"), v=Sum("state_version")).order_by()
    ):
        slot(row["tenant_id"])["tombstones"] = row["n"]
        slot(row["tenant_id"])["tombstoned_events"] = row["v"] or 0
    return counts


def _open_exclusive(path: Path) -> IO[bytes]:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    return os.fdopen(fd, "wb")


def write_anchor(directory: Path | None = None, *, chunk: int = CHUNK) -> Written:
    """Write one anchor of the whole database to ``directory`` (``AUDIT_ANCHOR_DIR``); its path and counts.

    1. Open a new temporary file exclusively (O_EXCL) in the directory.
    2. In one read-only snapshot: the header, every task (keyset chunks), every tombstone, the
       per-tenant counts; each line also goes into a running SHA-256.
    3. Sign the digest with ``AUDIT_ANCHOR_KEY``, append the signature line, fsync.
    4. Make it read-only and link it to its final name, which fails if that name exists (never
       an overwrite); drop the temporary name; fsync the directory.
    """
    directory = directory or anchor_dir()
    directory.mkdir(parents=True, exist_ok=True)
    private = anchor_signing_key()
    key = fingerprint(private.public_key())
    created = timezone.now()
    name = f"anchor-{created.astimezone(UTC):%Y%m%dT%H%M%S%fZ}"
    temporary = directory / f".{name}.{os.getpid()}.tmp"
    final = directory / f"{name}{SUFFIX}"
    written = Written(final)
    digest = hashlib.sha256()
    try:
        with _open_exclusive(temporary) as out:

            def emit(record: dict[str, Any]) -> None:
                line = _line(record)
                digest.update(line)
                out.write(line)

            emit(
                {
                    "format": FORMAT,
                    "format_version": FORMAT_VERSION,
                    "created_at": _iso(created),
                    "signing_key": key,
                    "chain_key_ids": list(chain_keys()),
                    # When the chain was keyed: moving it later would let unkeyed rewrites pass.
                    "keyed_since": _iso(keyed) if (keyed := keyed_since()) else None,
                }
            )
            with snapshot():
                for page in _task_chunks(chunk):
                    for task_id, tenant_id, version, head, takeover_head in page:
                        record = {"task": str(task_id), "tenant": tenant_id, "version": version, "head": head}
                        if takeover_head:  # only for a task taken over: older anchors read the same
                            record["takeover_head"] = takeover_head
                        emit(record)
                    written.tasks += len(page)
                for stones in _tombstone_chunks(chunk):
                    for stone in stones:
                        emit(
                            {
                                "tombstone": str(stone.task_id),
                                "tenant": stone.tenant_id,
                                "version": stone.state_version,
                                "head": stone.audit_head,
                                "deleted_at": _iso(stone.deleted_at),
                            }
                        )
                    written.tombstones += len(stones)
                counts = tenant_counts()
            for tenant_id in sorted(counts):
                emit({"tenant": tenant_id, **counts[tenant_id]})
            written.tenants = len(counts)
            signature = private.sign(SIGNED_PREFIX + digest.hexdigest().encode())
            out.write(
                _line(
                    {
                        "signature": {
                            "algorithm": "ed25519",
                            "key": key,
                            "sha256": digest.hexdigest(),
                            "value": base64.b64encode(signature).decode(),
                        },
                        "tasks": written.tasks,
                        "tombstones": written.tombstones,
                        "tenants": written.tenants,
                    }
                )
            )
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o444)
        os.link(temporary, final)  # FileExistsError rather than replace an anchor
    finally:
        temporary.unlink(missing_ok=True)
    _fsync_directory(directory)
    AnchorRun.objects.create(created_at=created, name=final.name, tasks=written.tasks)
    return written


def anchored_at(path: Path) -> datetime:
    """When the anchor at ``path`` was taken, from its name (``anchor-<UTC timestamp>.jsonl``)."""
    stamp = path.name.removeprefix("anchor-").removesuffix(SUFFIX)
    return datetime.strptime(stamp, "%Y%m%dT%H%M%S%fZ").replace(tzinfo=UTC)


def anchor_if_due(directory: Path | None = None, *, now: datetime | None = None) -> Written | None:
    """Write an anchor if one is due (see the module's docstring); what was written, or None.

    Due when the directory holds none, its newest is ``AUDIT_ANCHOR_INTERVAL`` seconds old, or a
    doorbell rang. The doorbells read before the anchor's snapshot committed before it, so the
    anchor covers them: exactly those are removed afterwards (one rung meanwhile stays for the
    next poll).
    """
    directory = directory or anchor_dir()
    now = now or timezone.now()
    rung = list(AnchorRequest.objects.order_by("id").values_list("id", flat=True)[:CHUNK])
    newest = latest_anchor(directory) if directory.is_dir() else None
    interval = float(settings.AUDIT_ANCHOR_INTERVAL)
    if not rung and newest is not None and (now - anchored_at(newest)).total_seconds() < interval:
        return None
    written = write_anchor(directory)
    AnchorRequest.objects.filter(id__in=rung).delete()
    return written


def last_run() -> AnchorRun | None:
    """The newest anchor the job recorded writing (for display: the console's integrity badge)."""
    return AnchorRun.objects.order_by("-created_at").first()


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_anchor(directory: Path) -> Path | None:
    """The newest anchor in ``directory`` (names sort by their UTC timestamp), or None."""
    found = sorted(directory.glob(f"anchor-*{SUFFIX}"))
    return found[-1] if found else None


# --- Reading and checking -------------------------------------------------------------------------


class AnchorInvalid(Exception):
    """The anchor file cannot be trusted: unreadable, malformed, or its signature does not verify."""


def _lines(path: Path) -> Iterator[bytes]:
    with path.open("rb") as source:
        yield from source


def check_signature(path: Path) -> dict[str, Any]:
    """The anchor's header, once its signature verifies with a trusted key; else ``AnchorInvalid``."""
    digest = hashlib.sha256()
    last: bytes | None = None
    header: dict[str, Any] | None = None
    try:
        for line in _lines(path):
            if last is not None:
                digest.update(last)
            if header is None:
                header = json.loads(line)
            last = line
    except (OSError, ValueError) as exc:
        raise AnchorInvalid(f"cannot read: {exc}") from None
    if last is None or header is None or header.get("format") != FORMAT:
        raise AnchorInvalid("not an audit anchor")
    try:
        sealed = json.loads(last)["signature"]
        key, claimed, value = (
            sealed["key"],
            sealed["sha256"],
            base64.b64decode(sealed["value"], validate=True),
        )
    except (ValueError, KeyError, TypeError):
        raise AnchorInvalid("no signature line at its end (truncated or appended to)") from None
    trusted = anchor_public_keys()
    if key not in trusted:
        raise AnchorInvalid(f"signed by key {key}, which is not trusted here (AUDIT_ANCHOR_PUBLIC_KEYS)")
    if claimed != digest.hexdigest():
        raise AnchorInvalid("signature does not verify: the contents changed since it was signed")
    try:
        trusted[key].verify(value, SIGNED_PREFIX + digest.hexdigest().encode())
    except InvalidSignature:
        raise AnchorInvalid("signature does not verify") from None
    return header


@dataclass
class Checked:
    """What a check against an anchor covered (for the summary line)."""

    created_at: str = ""
    tasks: int = 0
    tombstones: int = 0
    tenants: int = 0
    problems: int = 0
    excused: int = 0  # disagreements the caller's ``excuse`` explained (a documented restore)


@dataclass(frozen=True)
class Finding:
    """One disagreement of the database with an anchor: its line, and what it is about.

    ``kind``: ``gone`` (an anchored task deleted without a valid tombstone), ``behind`` (at an older
    version than anchored), ``event_missing`` / ``event_differs`` (its event at the anchored version),
    ``takeover_missing``, ``tenant_changed``, ``tasks_count`` / ``events_count`` (a tenant has
    ``short`` fewer than anchored), or ``other`` (tombstones, the keying moment).
    """

    kind: str
    text: str
    task: str | None = None
    tenant: int | None = None
    version: int | None = None  # the anchored version of ``task``
    short: int = 0

    def __str__(self) -> str:
        return self.text


# Whether something above this layer explains a finding (``ledger.restores``: a documented restore).
Excuse = Callable[[Finding], bool]


@dataclass(frozen=True)
class Loss:
    """An anchored task the database no longer has (``version_now`` None) or has at an older version."""

    task: str
    tenant: int
    version_anchored: int
    version_now: int | None


def _records(path: Path) -> Iterator[dict[str, Any]]:
    """The anchor's body records, in file order: the header and the signature line left out."""
    lines = _lines(path)
    next(lines, None)  # the header
    previous: bytes | None = None
    for line in lines:
        if previous is not None:
            yield json.loads(previous)
        previous = line  # the last one, the signature, is never yielded


def _tombstone_excuses(record: dict[str, Any], stone: Tombstone | None, keys: Keys) -> str | None:
    """Why ``stone`` does not account for the anchored task ``record``; None when it does."""
    if stone is None:
        return "no tombstone"
    broken = tombstone_problem(stone, *keys)
    if broken:
        return broken
    if stone.tenant_id != record["tenant"]:
        return f"its tombstone names tenant {stone.tenant_id}"
    if stone.state_version < record["version"]:
        return f"its tombstone is at v{stone.state_version}, before the anchored version"
    if stone.state_version == record["version"] and stone.audit_head != record["head"]:
        return "its tombstone's head differs from the anchored head"
    return None


def _events_at(batch: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """The hash of each anchored task's event at its anchored version, by (task id, version): one query.

    PostgreSQL joins the batch as two arrays (one index probe per pair on ``event_one_per_version``);
    an OR of a thousand conditions costs more to plan than to run. Elsewhere (the SQLite demo), the OR.
    """
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(TransitionEvent._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT e.task_id, e.state_version, e.hash FROM {table} e"
                " JOIN unnest(%s::uuid[], %s::integer[]) AS a(task_id, version)"
                " ON e.task_id = a.task_id AND e.state_version = a.version",
                [[record["task"] for record in batch], [record["version"] for record in batch]],
            )
            rows = cursor.fetchall()
    else:
        wanted = Q()
        for record in batch:
            wanted |= Q(task_id=record["task"], state_version=record["version"])
        rows = list(TransitionEvent.objects.filter(wanted).values_list("task_id", "state_version", "hash"))
    return {(str(task_id), version): link for task_id, version, link in rows}


def _takeovers_at(batch: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """Of the anchored takeover heads in ``batch``, the (task id, hash) pairs whose takeover still exists."""
    taken = [record for record in batch if record.get("takeover_head")]
    if not taken:
        return set()
    rows = LeaseTakeover.objects.filter(  # by task first: the (task, taken_at) index
        task_id__in=[record["task"] for record in taken],
        hash__in=[record["takeover_head"] for record in taken],
    ).values_list("task_id", "hash")
    return {(str(task_id), link) for task_id, link in rows}


def _finding(record: dict[str, Any], kind: str, text: str) -> Finding:
    """A finding about the anchored task ``record``."""
    at = f"task {record['task']} v{record['version']} (tenant {record['tenant']})"
    return Finding(
        kind, f"{at}: {text}", task=record["task"], tenant=record["tenant"], version=record["version"]
    )


def _check_tasks(batch: list[dict[str, Any]], keys: Keys) -> Iterator[Finding]:
    ids = [record["task"] for record in batch]
    found = {
        str(row["id"]): row
        for row in Task._default_manager.filter(id__in=ids).values("id", "tenant_id", "state_version")
    }
    anchored_events = _events_at(batch)
    anchored_takeovers = _takeovers_at(batch)
    missing = [record["task"] for record in batch if record["task"] not in found]
    stones = {str(stone.task_id): stone for stone in Tombstone.objects.filter(task_id__in=missing)}
    for record in batch:
        task_id, version = record["task"], record["version"]
        row = found.get(task_id)
        if row is None:
            why = _tombstone_excuses(record, stones.get(task_id), keys)
            if why:
                yield _finding(record, "gone", f"anchored, now deleted, and {why}")
            continue
        if row["tenant_id"] != record["tenant"]:
            yield _finding(record, "tenant_changed", f"now in tenant {row['tenant_id']}")
        if row["state_version"] < version:
            yield _finding(
                record, "behind", f"task is now at v{row['state_version']}, before its anchored version"
            )
        link = anchored_events.get((task_id, version))
        if link is None:
            yield _finding(record, "event_missing", "the anchored event is missing")
        elif link != record["head"]:
            yield _finding(
                record,
                "event_differs",
                "event hash differs from the anchored head (history rewritten since the anchor)",
            )
        if record.get("takeover_head") and (task_id, record["takeover_head"]) not in anchored_takeovers:
            yield _finding(
                record,
                "takeover_missing",
                "the anchored lease takeover is missing (takeover history deleted or rewritten)",
            )


def _check_tombstones(batch: list[dict[str, Any]]) -> Iterator[Finding]:
    stored = {
        str(stone.task_id): stone
        for stone in Tombstone.objects.filter(task_id__in=[record["tombstone"] for record in batch])
    }
    for record in batch:
        stone = stored.get(record["tombstone"])
        if stone is None:
            yield Finding(
                "other",
                f"tombstone of task {record['tombstone']} (tenant {record['tenant']}): anchored, now gone",
            )
        elif (stone.state_version, stone.audit_head) != (record["version"], record["head"]):
            yield Finding("other", f"tombstone of task {record['tombstone']}: differs from the anchored one")


def _check_keyed_since(header: dict[str, Any]) -> Iterator[Finding]:
    """The moment the chain was keyed, as the anchor recorded it, against the database's now."""
    if "keyed_since" not in header:
        return  # an anchor from before it was recorded
    keyed = keyed_since()
    now = _iso(keyed) if keyed else None
    if now != header["keyed_since"]:
        yield Finding(
            "other",
            f"the chain was keyed at {header['keyed_since']} by the anchor, at {now} by the database now "
            "(django_migrations edited: unkeyed events would pass as older history)",
        )


def _check_counts(anchored: dict[int, dict[str, int]]) -> Iterator[Finding]:
    with snapshot():
        now = tenant_counts()
    empty = {"tasks": 0, "events": 0, "tombstones": 0, "tombstoned_events": 0}
    for tenant_id in sorted(anchored):
        was, current = anchored[tenant_id], now.get(tenant_id, empty)
        tasks_was, tasks_now = was["tasks"] + was["tombstones"], current["tasks"] + current["tombstones"]
        if tasks_now < tasks_was:
            yield Finding(
                "tasks_count",
                f"tenant {tenant_id}: {tasks_now} tasks now (counting tombstones), {tasks_was} anchored: "
                f"{tasks_was - tasks_now} deleted without a tombstone",
                tenant=tenant_id,
                short=tasks_was - tasks_now,
            )
        events_was = was["events"] + was["tombstoned_events"]
        events_now = current["events"] + current["tombstoned_events"]
        if events_now < events_was:
            yield Finding(
                "events_count",
                f"tenant {tenant_id}: {events_now} events now (counting tombstoned tasks'), {events_was} "
                f"anchored: {events_was - events_now} events deleted or truncated",
                tenant=tenant_id,
                short=events_was - events_now,
            )


def check_against(
    path: Path, checked: Checked, *, chunk: int = CHUNK, excuse: Excuse | None = None
) -> Iterator[str]:
    """Every problem of the live database against the anchor at ``path``, one line each.

    First the signature (nothing else is trusted before it verifies); then each anchored task
    (exists or is accounted for by a sealed tombstone, not gone back in version, its event at
    the anchored version carries the anchored head), each anchored tombstone (still there,
    unchanged) and each tenant's counts (not lower). The chains themselves are verified by the
    caller (``verify_audit``), which does that for every task. ``excuse``: a disagreement it
    explains is counted in ``checked.excused`` instead of reported (``verify_audit`` passes the
    documented restores, ``ledger.restores``).
    """
    try:
        header = check_signature(path)
    except AnchorInvalid as exc:
        checked.problems += 1
        yield f"anchor {path}: {exc}"
        return
    checked.created_at = str(header.get("created_at", ""))
    # The chain keys check a tombstone's older seal; only an anchor key may sign it.
    keys: Keys = (chain_keys(), anchor_public_keys())
    tasks: list[dict[str, Any]] = []
    stones: list[dict[str, Any]] = []
    anchored_counts: dict[int, dict[str, int]] = {}

    def problems_of(found: Iterator[Finding]) -> Iterator[str]:
        for finding in found:
            if excuse is not None and excuse(finding):
                checked.excused += 1
                continue
            checked.problems += 1
            yield finding.text

    yield from problems_of(_check_keyed_since(header))
    for record in _records(path):
        if "task" in record:
            tasks.append(record)
            if len(tasks) == chunk:
                checked.tasks += len(tasks)
                yield from problems_of(_check_tasks(tasks, keys))
                tasks = []
        elif "tombstone" in record:
            stones.append(record)
            if len(stones) == chunk:
                checked.tombstones += len(stones)
                yield from problems_of(_check_tombstones(stones))
                stones = []
        else:
            tenant_id = record.pop("tenant")
            anchored_counts[tenant_id] = record
    if tasks:
        checked.tasks += len(tasks)
        yield from problems_of(_check_tasks(tasks, keys))
    if stones:
        checked.tombstones += len(stones)
        yield from problems_of(_check_tombstones(stones))
    checked.tenants = len(anchored_counts)
    yield from problems_of(_check_counts(anchored_counts))


def losses_against(path: Path, *, chunk: int = CHUNK) -> Iterator[Loss]:
    """The anchored tasks the database lost since the anchor at ``path``: gone (with no tombstone,
    so not deleted by retention) or at an older version than anchored, in the anchor's order.

    What a restore from an older backup looks like against the newest anchor written before it
    (``runtime.recover`` records them). ``AnchorInvalid`` when its signature does not verify.
    """
    check_signature(path)
    batch: list[dict[str, Any]] = []

    def lost(records: list[dict[str, Any]]) -> Iterator[Loss]:
        ids = [record["task"] for record in records]
        now = {
            str(task_id): version
            for task_id, version in Task._default_manager.filter(id__in=ids).values_list(
                "id", "state_version"
            )
        }
        stoned = {str(t) for t in Tombstone.objects.filter(task_id__in=ids).values_list("task_id", flat=True)}
        for record in records:
            task_id, version = record["task"], record["version"]
            if task_id not in now and task_id not in stoned:
                yield Loss(task_id, record["tenant"], version, None)
            elif task_id in now and now[task_id] < version:
                yield Loss(task_id, record["tenant"], version, now[task_id])

    for record in _records(path):
        if "task" in record:
            batch.append(record)
            if len(batch) == chunk:
                yield from lost(batch)
                batch = []
    if batch:
        yield from lost(batch)
