"""Retention: ended tasks archived after N days and deleted after M, per tenant and task type.

Which numbers apply: the tenant's ``RetentionPolicy`` for the task's type, else the tenant's
policy for every type, else the defaults in settings (``RETENTION_ARCHIVE_AFTER_DAYS``, 30, and
``RETENTION_DELETE_AFTER_DAYS``, 365; 0 means never). Days count from the moment the task
entered its terminal state (``state_entered_at``: a terminal task's only later transitions are
self-loops, which leave it alone).

What is never touched: a task that has not ended (the candidate query selects terminal tasks
only, and every batch checks each locked row again and refuses the whole batch if one is not:
``RetentionRefused``), and a task under a legal hold (``LegalHold`` in force; placed and lifted
by tenant admins: ``protection.holds``).

Archiving a task erases what it no longer needs and keeps the evidence:

- every sealed value in its rows is erased in place (``{"$sealed":"erased","t":""}``): in
  checkpoint bodies with ``sealing.erase_text``, whose blanked form — and so the digest the
  audit chain recorded — does not change (each body is checked before it is written); in every
  JSON column of every row that belongs to the task (its input and outcome, input answers,
  external events, action effects, approval requests, and the rows of any app above that refers
  to a task): found through the model graph, so this layer imports none of them;
- values of the task type's sensitive fields still held in clear (rows written before sealing)
  are erased too where the column says which keys are sensitive: the task's ``input`` and
  ``outcome`` and external event payloads. In checkpoint bodies they cannot be: the digest is
  taken over them;
- actions keep their idempotency key, dispatch state, effect digest and outcome; approval
  decisions are not touched at all; events and checkpoints keep every byte the chain covers.

Transient model context: checkpoints hold none beyond the facts. A model turn stores its answer
(bounded, validated text) and the model id as facts (``runtime.engine``); prompts are referenced
by id and never stored, and there are no transcripts. Those answers are covered by the checkpoint
digest, so they stay: removing them would break the chain the anchors vouch for.

Deleting a task removes it with every row that refers to it (found the same way, deepest first)
in one transaction per batch on the owner's retention path (``audit.tombstones.retention_path``),
after inserting a ``Tombstone`` per task with its last version and chain head, signed with the
anchor key (``AUDIT_ANCHOR_KEY``: a deletion runs only where that key is, never in the app), so
anchors taken before the deletion still verify and the next anchor — asked for at once, by an
``AnchorRequest`` — lists the tombstone. Only the database owner may do that, and archive too:
erasing rewrites a task's input and its approval requests' copies, which the application's role
may not update (docs/operating/tamper-evidence.md#database-roles); connected as that role, a run
changes nothing and reports what is due as awaiting the owner. A task whose chain does not verify
(links and path, ``tasks.audit_paths``) is never deleted: its evidence stays, and no signature vouches
for it. A task that a surviving task reruns or descends from (``rerun_of``, ``parent``) is kept until
that task goes too; tasks that go together go in one transaction.

A run is idempotent (an archived task is not archived again; a deleted one is gone), and the
dry run and the real run share every decision (``plan_batch``); the real run re-checks each
under the row lock before acting.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Exists, OuterRef, Q
from django.db.models.functions import Cast
from django.utils import timezone

from audit import sealing
from audit.models import AnchorRequest, Tombstone
from audit.tombstones import make_tombstone, retention_path
from audit.verify import keyed_since
from protection.holds import holds_in_force
from tasks import checkpoints, registry, services
from tasks.audit_paths import verify_chain
from tasks.models import Archive, Checkpoint, ExternalEvent, RetentionPolicy, Task
from tasks.states import TERMINAL
from tenancy.models import Tenant

log = logging.getLogger(__name__)
ARCHIVE, DELETE = "archive", "delete"
ERASED_ENVELOPE = {sealing.MARK: sealing.ERASED, sealing.TOKEN: ""}
SEALED_TEXT = f'"{sealing.MARK}"'
ERASED_SHOWN = '"[erased]"'  # an erased value, as an archived checkpoint is read (``read_archived``)


class RetentionRefused(Exception):
    """A batch held a task retention must not touch (one that has not ended): nothing was changed."""


# --- rules ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """When ended tasks of one tenant and type are archived and deleted (days; None: never)."""

    archive_after: int | None
    delete_after: int | None
    source: str  # which policy, in words (kept in archive records and tombstones)

    def cutoff(self, kind: str, now: datetime) -> datetime | None:
        """Tasks that ended before this moment are due for ``kind``; None: never due."""
        days = self.archive_after if kind == ARCHIVE else self.delete_after
        return now - timedelta(days=days) if days else None

    def describe(self) -> str:
        archive = f"archive after {self.archive_after} d" if self.archive_after else "never archive"
        delete = f"delete after {self.delete_after} d" if self.delete_after else "never delete"
        return f"{archive}, {delete} ({self.source})"


def _days(value: int | None) -> int | None:
    return value or None  # 0 and None: never


def default_rule() -> Rule:
    return Rule(
        _days(settings.RETENTION_ARCHIVE_AFTER_DAYS), _days(settings.RETENTION_DELETE_AFTER_DAYS), "default"
    )


class TenantRules:
    """One tenant's rules: its policy per task type, its policy for every type, the defaults."""

    def __init__(self, tenant: Tenant) -> None:
        self.tenant = tenant
        self.by_type: dict[str, Rule] = {}
        self.general = default_rule()
        for policy in RetentionPolicy.objects.filter(tenant=tenant).order_by("task_type"):
            where = f"policy {tenant.slug}/{policy.task_type or '*'}"
            rule = Rule(_days(policy.archive_after_days), _days(policy.delete_after_days), where)
            if policy.task_type:
                self.by_type[policy.task_type] = rule
            else:
                self.general = rule

    def rule(self, task_type: str) -> Rule:
        return self.by_type.get(task_type, self.general)

    def due(self, kind: str, now: datetime) -> Q:
        """The tasks whose rule makes ``kind`` due at ``now``: the SQL side of ``verdict``."""
        condition = Q(pk__in=[])
        for task_type, rule in self.by_type.items():
            cutoff = rule.cutoff(kind, now)
            if cutoff is not None:
                condition |= Q(task_type=task_type, state_entered_at__lt=cutoff)
        cutoff = self.general.cutoff(kind, now)
        if cutoff is not None:
            others = Q(state_entered_at__lt=cutoff)
            if self.by_type:
                others &= ~Q(task_type__in=sorted(self.by_type))
            condition |= others
        return condition


def _before(moment: datetime, cutoff: datetime | None) -> bool:
    return cutoff is not None and moment < cutoff


def verdict(rule: Rule, ended_at: datetime, *, archived: bool, now: datetime) -> str | None:
    """What ``rule`` makes due for an ended task, unheld: DELETE, ARCHIVE or nothing (None)."""
    if _before(ended_at, rule.cutoff(DELETE, now)):
        return DELETE
    if not archived and _before(ended_at, rule.cutoff(ARCHIVE, now)):
        return ARCHIVE
    return None


def _archive_due(rule: Rule, ended_at: datetime, *, archived: bool, now: datetime) -> bool:
    return not archived and _before(ended_at, rule.cutoff(ARCHIVE, now))


# --- the plan ------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """One tenant and task type's counts in a run."""

    archive: int = 0
    delete: int = 0
    held: int = 0  # due, but under a legal hold: left alone
    kept: int = 0  # deletion due, but a task that stays reruns or descends from it
    awaiting_owner: int = 0  # archive or deletion due, but this connection is not the owner role
    rule: str = ""  # the rule in force, in words


@dataclass(frozen=True)
class Item:
    """One task a run archives or deletes."""

    action: str
    task_id: UUID
    tenant: str
    task_type: str
    state: str
    ended_at: datetime
    rule: Rule


@dataclass
class Report:
    dry_run: bool
    may_delete: bool
    tallies: dict[tuple[str, str], Tally] = field(default_factory=dict)
    examined: int = 0  # candidates read
    archived: int = 0  # done (a real run)
    deleted: int = 0
    batches: int = 0

    def tally(self, rules: TenantRules, task_type: str) -> Tally:
        key = (rules.tenant.slug, task_type)
        if key not in self.tallies:
            self.tallies[key] = Tally(rule=rules.rule(task_type).describe())
        return self.tallies[key]

    def total(self, name: str) -> int:
        return sum(getattr(tally, name) for tally in self.tallies.values())


ROW_FIELDS = ("id", "tenant_id", "task_type", "state", "state_entered_at", "parent_id", "rerun_of_id")


def _rows(queryset: models.QuerySet[Task]) -> models.QuerySet[Task, dict[str, Any]]:
    """Task rows as retention reads them: the columns it decides by, whether archived, whether held."""
    rows: models.QuerySet[Task, dict[str, Any]] = queryset.annotate(
        archived=Exists(Archive.objects.filter(task_id=OuterRef("pk"))),
        held=Exists(holds_in_force().filter(task_id=OuterRef("pk"))),
    ).values(*ROW_FIELDS, "archived", "held")
    return rows


def _candidates(
    tenant: Tenant, rules: TenantRules, now: datetime, size: int
) -> Iterator[list[dict[str, Any]]]:
    """The tenant's ended, unheld tasks with something due, ``size`` per query in id order (keyset).

    The range on ``state_entered_at`` per type uses the ``task_tenant_entered`` index.
    """
    due = rules.due(DELETE, now) | (rules.due(ARCHIVE, now) & Q(archive__isnull=True))
    tasks = (
        Task.objects.filter(tenant=tenant, state__in=sorted(TERMINAL))
        .filter(due)
        .exclude(Exists(holds_in_force().filter(task_id=OuterRef("pk"))))
        .order_by("id")
    )
    after: UUID | None = None
    while True:
        page = list(_rows(tasks.filter(id__gt=after) if after is not None else tasks)[:size])
        if page:
            yield page
        if len(page) < size:
            return
        after = page[-1]["id"]


def _count_held(tenant: Tenant, rules: TenantRules, now: datetime, report: Report) -> None:
    due = rules.due(DELETE, now) | (rules.due(ARCHIVE, now) & Q(archive__isnull=True))
    held = (
        Task.objects.filter(tenant=tenant, state__in=sorted(TERMINAL))
        .filter(due)
        .filter(Exists(holds_in_force().filter(task_id=OuterRef("pk"))))
        .values("task_type")
        .annotate(n=models.Count("id"))
        .order_by()
    )
    for row in held:
        report.tally(rules, row["task_type"]).held += row["n"]


def _deletable(
    candidates: dict[UUID, dict[str, Any]], rules: TenantRules, now: datetime, claimed: set[UUID]
) -> tuple[dict[UUID, dict[str, Any]], set[UUID]]:
    """Which ``candidates`` (due for deletion) can go now, with the tasks that must go with them.

    A task that a surviving task reruns or descends from stays (its foreign key would dangle).
    The tasks referring to a candidate are looked at in turn: one due for deletion itself goes
    in the same transaction (and is ``claimed``, so a later batch does not list it again); any
    other keeps every candidate it refers to, and so on up the chain.
    Returns (the tasks that go, by id; the candidates kept).
    """
    going = dict(candidates)
    edges: list[tuple[UUID, UUID]] = []  # (referring task, the task it refers to)
    kept: set[UUID] = set()
    frontier = set(going)
    while frontier:
        referring = _rows(Task.objects.filter(Q(parent_id__in=frontier) | Q(rerun_of_id__in=frontier)))
        frontier = set()
        for row in referring:
            targets = [ref for ref in (row["parent_id"], row["rerun_of_id"]) if ref in going]
            edges.extend((row["id"], target) for target in targets)
            if row["id"] in going or row["id"] in claimed:
                continue
            goes_too = (
                row["tenant_id"] == rules.tenant.pk
                and row["state"] in TERMINAL
                and not row["held"]
                and verdict(
                    rules.rule(row["task_type"]), row["state_entered_at"], archived=row["archived"], now=now
                )
                == DELETE
            )
            if goes_too:
                going[row["id"]] = row
                frontier.add(row["id"])
            else:
                kept.update(targets)
    spread = True
    while spread:
        spread = False
        for referring_id, target in edges:
            if referring_id in kept and target not in kept:
                kept.add(target)
                spread = True
    return {task_id: row for task_id, row in going.items() if task_id not in kept}, kept & set(candidates)


@dataclass
class Batch:
    archive: list[dict[str, Any]] = field(default_factory=list)
    delete: list[dict[str, Any]] = field(default_factory=list)


def plan_batch(
    rows: list[dict[str, Any]],
    rules: TenantRules,
    now: datetime,
    *,
    may_delete: bool,
    claimed: set[UUID],
    report: Report,
) -> Batch:
    """What a run does with one page of candidates (``report`` counts it)."""
    batch = Batch()
    due_deletion: dict[UUID, dict[str, Any]] = {}
    for row in rows:
        if row["id"] in claimed:
            continue  # deleted with a task of an earlier batch
        rule = rules.rule(row["task_type"])
        decided = verdict(rule, row["state_entered_at"], archived=row["archived"], now=now)
        if decided == DELETE:
            due_deletion[row["id"]] = row
        elif decided == ARCHIVE and may_delete:
            batch.archive.append(row)
        elif decided == ARCHIVE:  # erasing rewrites columns only the owner may (db_roles: WITHHELD)
            report.tally(rules, row["task_type"]).awaiting_owner += 1
    if due_deletion:
        if may_delete:
            going, kept = _deletable(due_deletion, rules, now, claimed)
        else:
            going, kept = {}, set()
        stay = [row for task_id, row in sorted(due_deletion.items()) if task_id not in going]
        for row in stay:
            tally = report.tally(rules, row["task_type"])
            if row["id"] in kept:
                tally.kept += 1
            else:
                tally.awaiting_owner += 1
        for row in stay if may_delete else ():
            rule = rules.rule(row["task_type"])
            if _archive_due(rule, row["state_entered_at"], archived=row["archived"], now=now):
                batch.archive.append(row)
        claimed.update(task_id for task_id in going if task_id not in due_deletion)
        batch.delete = sorted(going.values(), key=lambda row: row["id"])
    batch.archive.sort(key=lambda row: row["id"])
    for row in batch.archive:
        report.tally(rules, row["task_type"]).archive += 1
    for row in batch.delete:
        report.tally(rules, row["task_type"]).delete += 1
    return batch


def may_delete() -> bool:
    """Whether this connection can archive and delete history: on PostgreSQL only the tables' owner can."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_has_role(current_user, relowner, 'MEMBER') FROM pg_class WHERE oid = %s::regclass",
            [Task._meta.db_table],
        )
        (owner,) = cursor.fetchone()
    return bool(owner)


def run(
    *,
    dry_run: bool,
    tenant: str | None = None,
    batch_size: int = 500,
    now: datetime | None = None,
    on_item: Callable[[Item], None] | None = None,
    on_batch: Callable[[str, Report], None] | None = None,
) -> Report:
    """Archive and delete what the policies make due (``dry_run``: decide only); the counts.

    1. Per tenant (``tenant``: that slug only), in slug order: its rules; the held tasks counted.
    2. Its candidates, ``batch_size`` per page in id order; each page planned (``plan_batch``);
       every task acted on is passed to ``on_item``.
    3. Unless ``dry_run``: the page's archive in one transaction, its deletions in another (on the
       retention path), each re-checking every task under a row lock; then ``on_batch``.

    Raises ``Tenant.DoesNotExist`` for an unknown ``tenant``, ``RetentionRefused`` (nothing of that
    batch changed) when a batch held a task that has not ended.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    now = now or timezone.now()
    report = Report(dry_run=dry_run, may_delete=may_delete())
    tenants = [Tenant.objects.get(slug=tenant)] if tenant is not None else Tenant.objects.order_by("slug")
    for each in tenants:
        rules = TenantRules(each)
        _count_held(each, rules, now, report)
        claimed: set[UUID] = set()
        for rows in _candidates(each, rules, now, batch_size):
            report.examined += len(rows)
            batch = plan_batch(rows, rules, now, may_delete=report.may_delete, claimed=claimed, report=report)
            if on_item is not None:
                for action, chosen in ((ARCHIVE, batch.archive), (DELETE, batch.delete)):
                    for row in chosen:
                        on_item(_item(action, row, each, rules))
            if not dry_run:
                report.archived += archive_tasks([row["id"] for row in batch.archive], rules, now)
                report.deleted += delete_tasks([row["id"] for row in batch.delete], rules, now)
            report.batches += 1
            if on_batch is not None:
                on_batch(each.slug, report)
    return report


def _item(action: str, row: dict[str, Any], tenant: Tenant, rules: TenantRules) -> Item:
    return Item(
        action, row["id"], tenant.slug, row["task_type"], row["state"], row["state_entered_at"],
        rules.rule(row["task_type"]),
    )  # fmt: skip


# --- acting on a batch ---------------------------------------------------------------------------------


def _locked(ids: Collection[UUID]) -> list[Task]:
    """The tasks, row-locked (FOR UPDATE: a rerun or child being created waits, then fails if its
    referent went); refuses the batch if one has not ended."""
    tasks = list(Task.objects.select_for_update().filter(pk__in=list(ids)).order_by("id"))
    for task in tasks:
        if task.state not in TERMINAL:
            raise RetentionRefused(
                f"task {task.pk} is {task.state}: retention never touches a task that has not ended"
            )
    return tasks


def _held(ids: Collection[UUID]) -> set[UUID]:
    return set(holds_in_force().filter(task_id__in=list(ids)).values_list("task_id", flat=True))


def archive_tasks(ids: Collection[UUID], rules: TenantRules, now: datetime) -> int:
    """Archive these tasks (those still due, unheld, unarchived once locked); how many were."""
    if not ids:
        return 0
    with transaction.atomic():
        tasks = _locked(ids)
        held = _held(ids)
        done = set(Archive.objects.filter(task_id__in=list(ids)).values_list("task_id", flat=True))
        due = [
            task
            for task in tasks
            if task.pk not in held
            and _archive_due(
                rules.rule(task.task_type), task.state_entered_at, archived=task.pk in done, now=now
            )
        ]
        if not due:
            return 0
        erased = _erase_task_rows(due)
        Archive.objects.bulk_create(
            Archive(
                task=task,
                archived_at=now,
                rule=rules.rule(task.task_type).describe()[:200],
                erased=erased[task.pk],
            )
            for task in due
        )
    return len(due)


def delete_tasks(ids: Collection[UUID], rules: TenantRules, now: datetime) -> int:
    """Delete these tasks (those still due and unheld once locked, and not referred to by a task that
    stays) with all their rows, leaving a tombstone each; how many went. Needs the owner role."""
    if not ids:
        return 0
    with retention_path():
        tasks = _locked(ids)
        held = _held(ids)
        due = {
            task.pk: task
            for task in tasks
            if task.pk not in held
            and verdict(rules.rule(task.task_type), task.state_entered_at, archived=True, now=now) == DELETE
        }
        keyed = keyed_since()
        going = _unreferenced({task_id for task_id, task in due.items() if _verifies(task, keyed)})
        if not going:
            return 0
        Tombstone.objects.bulk_create(
            make_tombstone(
                task_id=task.pk,
                tenant_id=task.tenant_id,
                task_type=task.task_type,
                state_version=task.state_version,
                audit_head=task.audit_head,
                reason=_why_deleted(task, rules.rule(task.task_type)),
                deleted_at=now,
            )
            for task in (due[task_id] for task_id in sorted(going))
        )
        AnchorRequest.objects.create(requested_at=now, reason="retention")  # anchor the tombstones soon
        _delete_rows(sorted(going))
    return len(going)


def _verifies(task: Task, keyed: datetime | None) -> bool:
    """Whether ``task``'s chain verifies, so that a signed tombstone may vouch for it (else kept)."""
    broken = verify_chain(task, keyed=keyed)
    if broken is not None:
        log.warning(
            "not deleting a task whose audit chain is broken",
            extra={"task_id": str(task.pk), "broken": str(broken)},
        )
    return broken is None


def _why_deleted(task: Task, rule: Rule) -> str:
    return f"retention: {task.state} since {task.state_entered_at:%Y-%m-%d}; {rule.describe()}"[:200]


def _unreferenced(ids: set[UUID]) -> set[UUID]:
    """``ids`` without those a task outside them (created since the plan) reruns or descends from."""
    while ids:
        outside = (
            Task.objects.filter(Q(parent_id__in=ids) | Q(rerun_of_id__in=ids))
            .exclude(pk__in=ids)
            .values_list("parent_id", "rerun_of_id")
        )
        referred = {ref for pair in outside for ref in pair if ref in ids}
        if not referred:
            break
        ids = ids - referred
    return ids


# --- the rows that belong to a task ---------------------------------------------------------------------


@dataclass(frozen=True)
class Dependent:
    """A model whose rows belong to tasks, and the lookup from it to the task (``request__task``)."""

    model: type[models.Model]
    to_task: str
    nulls: str = ""  # the foreign key set to NULL instead (on_delete=SET_NULL); "": rows are deleted


DELETED_WITH = (models.CASCADE, models.PROTECT, models.RESTRICT, models.DO_NOTHING)


def _walk(
    model: type[models.Model], to_task: str, seen: frozenset[type[models.Model]]
) -> Iterator[Dependent]:
    """Every model referring to ``model``, its own dependents first (so deleting in this order never
    leaves a row whose parent is already gone)."""
    for relation in model._meta.related_objects:
        child = relation.related_model
        assert isinstance(child, type) and issubclass(child, models.Model)
        if child in seen or relation.many_to_many:
            continue  # a self-reference (a task's reruns, an action's compensations): same rows, same batch
        lookup = f"{relation.field.name}__{to_task}" if to_task else relation.field.name
        if relation.on_delete is models.SET_NULL:
            yield Dependent(child, lookup, nulls=relation.field.name)
        elif relation.on_delete in DELETED_WITH:
            yield from _walk(child, lookup, seen | {child})
            yield Dependent(child, lookup)
        else:
            raise RetentionRefused(
                f"{child.__name__}.{relation.field.name}: retention cannot follow its on_delete"
            )


@cache
def dependents() -> tuple[Dependent, ...]:
    """Every model with rows belonging to a task, deepest first: the model graph, not a list to keep up."""
    return tuple(_walk(Task, "", frozenset({Task})))


def _delete_rows(ids: list[UUID]) -> None:
    for dependent in dependents():
        rows = dependent.model._base_manager.filter(**{f"{dependent.to_task}__in": ids})
        if dependent.nulls:
            rows.update(**{dependent.nulls: None})
        else:
            # One DELETE per table: every row referring to these tasks is deleted here, explicitly, so
            # Django's emulated cascade (which refuses PROTECT, the events') has nothing to do.
            rows._raw_delete(rows.db)
    tasks = Task._base_manager.filter(pk__in=ids)
    tasks._raw_delete(tasks.db)


# --- erasing -------------------------------------------------------------------------------------------


def erase_json(value: Any, names: Collection[str] = ()) -> tuple[Any, int]:
    """``value`` with every sealed value erased, and (top level) the keys in ``names`` held in clear;
    with how many values were erased."""
    erased = 0

    def walk(item: Any) -> Any:
        nonlocal erased
        if sealing.is_envelope(item):
            if item.get(sealing.MARK) == sealing.ERASED:
                return item
            erased += 1
            return dict(ERASED_ENVELOPE)
        if isinstance(item, dict):
            return {key: walk(inner) for key, inner in item.items()}
        if isinstance(item, list):
            return [walk(inner) for inner in item]
        return item

    result = walk(value)
    if names and isinstance(result, dict):
        for name in names:
            if name in result and not sealing.is_envelope(result[name]) and result[name] not in (None, ""):
                result[name] = dict(ERASED_ENVELOPE)
                erased += 1
    return result, erased


def erase_body(body: str) -> tuple[str, int]:
    """A checkpoint body with its sealed values erased, its digest unchanged (checked); how many."""
    erased = sum(n for key_id, n in sealing.key_ids_in_text(body).items() if key_id != sealing.ERASED)
    if not erased:
        return body, 0
    result = sealing.erase_text(body)
    if checkpoints.digest(result) != checkpoints.digest(body):
        # Cannot happen with envelopes as this code writes them; never write a body the chain refuses.
        raise RetentionRefused("erasing would change a checkpoint's digest: nothing written")
    return result, erased


def read_archived(row: Checkpoint, *, recorded_digest: str | None) -> checkpoints.Checkpoint:
    """An archived task's checkpoint, for reading: verified against the digest its audit event
    recorded (unchanged by archiving), erased values shown as ``"[erased]"``.

    Never a resume: ``checkpoints.decode_stored`` refuses an erased value (no task resumes from
    one), and this is for the eyes of whoever reviews an archived task. Raises
    ``checkpoints.CheckpointUnreadable`` like ``decode_stored``.
    """
    checkpoints.verify_stored(
        row.body, codec=row.codec, stored_digest=row.digest, recorded_digest=recorded_digest
    )

    def shown(match: re.Match[str]) -> str:
        return ERASED_SHOWN if match.group(1) == sealing.ERASED else match.group(0)

    return checkpoints.decode(sealing.ENVELOPE_TEXT.sub(shown, row.body), row.schema_version)


def read_for_review(row: Checkpoint, *, recorded_digest: str | None) -> checkpoints.Checkpoint:
    """A checkpoint as the console and the API show it: an archived one (with erased values) through
    ``read_archived``, any other through ``decode_stored``. Raises ``checkpoints.CheckpointUnreadable``."""
    if any(found.group(1) == sealing.ERASED for found in sealing.ENVELOPE_TEXT.finditer(row.body)):
        return read_archived(row, recorded_digest=recorded_digest)
    return checkpoints.decode_stored(row, recorded_digest=recorded_digest)


def _json_columns(model: type[models.Model]) -> list[str]:
    return [f.attname for f in model._meta.concrete_fields if isinstance(f, models.JSONField)]


def _named(dependent: Dependent, column: str, row: dict[str, Any], types: dict[UUID, str]) -> frozenset[str]:
    """The keys of ``column`` the task type marks sensitive, where the column says which (else none)."""
    if dependent.model is ExternalEvent and column == "payload":
        return services.event_sensitive_keys(types[row["owning_task"]], row["event_type"])
    return frozenset()


def _erase_task_rows(tasks: list[Task]) -> Counter[UUID]:
    """Erase the sealed values of these tasks' rows (the tasks' own columns too); erased per task."""
    ids = [task.pk for task in tasks]
    types = {task.pk: task.task_type for task in tasks}
    erased: Counter[UUID] = Counter()
    for task in tasks:
        changes: dict[str, Any] = {}
        for column, names in (
            ("input", registry.sensitive_fields(task.task_type)),
            ("outcome", services.outcome_fields(task.task_type)),
        ):
            value, n = erase_json(getattr(task, column), names)
            if n:
                changes[column], erased[task.pk] = value, erased[task.pk] + n
        if changes:
            Task.objects.filter(pk=task.pk).update(**changes)
    for point in Checkpoint.objects.filter(task_id__in=ids, body__contains=SEALED_TEXT).only(
        "id", "task", "body"
    ):
        body, n = erase_body(point.body)
        if n:
            Checkpoint.objects.filter(pk=point.pk).update(body=body)
            erased[point.task_id] += n
    for dependent in dependents():
        if dependent.nulls:
            continue
        for column in _json_columns(dependent.model):
            erased.update(_erase_column(dependent, column, ids, types))
    return erased


def _erase_column(
    dependent: Dependent, column: str, ids: list[UUID], types: dict[UUID, str]
) -> Counter[UUID]:
    model = dependent.model
    rows = model._base_manager.filter(**{f"{dependent.to_task}__in": ids})
    named = model is ExternalEvent and column == "payload"
    if not named:  # only rows holding an envelope somewhere, found by their text
        rows = rows.alias(sealed_text=Cast(column, models.TextField())).filter(
            sealed_text__contains=SEALED_TEXT
        )
    extra = ("event_type",) if named else ()
    erased: Counter[UUID] = Counter()
    for row in rows.values("pk", column, *extra, owning_task=models.F(dependent.to_task)):
        value, n = erase_json(row[column], _named(dependent, column, row, types))
        if n:
            model._base_manager.filter(pk=row["pk"]).update(**{column: value})
            erased[row["owning_task"]] += n
    return erased
