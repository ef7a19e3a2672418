"""The task record and its checkpoints.

State fields are written only by ``tasks.transitions``; nothing here assigns
them. See DESIGN.md, "Task record" and "Checkpoint contract".
"""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q

from tasks.ids import uuid7
from tasks.states import ENDED_UNDONE, RUNNABLE, WAITING, State

# The task's optional references, indexed only where set (``Task.Meta.indexes``; migration 0016).
REFERENCES = ("owner", "api_token", "parent", "rerun_of", "compensates")
# The states the alerts scan finds overdue by their age alone (``runtime.alerts``), indexed by age where a
# task is in one of them (``task_alert_overdue``; migration 0017).
ALERT_OVERDUE_STATES = frozenset({State.QUARANTINED, State.CANCEL_REQUESTED, State.OUTCOME_UNKNOWN})


class Task(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    # No index of its own on the foreign keys: ``task_tenant_id`` (tenant, -id) serves every lookup by
    # tenant, and the other references are partial indexes in Meta (a task's row is rewritten by every
    # transition that changes its state, and each index costs an entry at each of those).
    tenant = models.ForeignKey(
        "tenancy.Tenant", on_delete=models.PROTECT, related_name="tasks", db_index=False
    )
    task_type = models.CharField(max_length=64)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    region = models.CharField(max_length=32, default="default")
    # The API token the task was started with (None: a console session, a worker, a parent): the money
    # policy's running totals per token (``ledger.money``) read it. A rerun keeps its task's token.
    api_token = models.ForeignKey(
        "tenancy.ApiToken",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    # Which region may advance the task, as of which ownership: ``manage.py failover`` bumps it, and every
    # worker's commit carries the epoch its lease was claimed at (``tasks.leases``), so a commit from the
    # region that lost the task is refused (``StaleEpoch``).
    ownership_epoch = models.PositiveIntegerField(default=1, db_default=1)
    # The schema version of the task's newest checkpoint: a worker whose code cannot read it does not
    # claim the task (mixed-version rollouts; ``tasks.checkpoints.READABLE``).
    checkpoint_schema = models.PositiveSmallIntegerField(default=2, db_default=2)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children", db_index=False
    )
    # The failed, expired or canceled task this one reruns (tasks.services.task_rerun). That
    # task is never rewritten; its reruns are found through this column's FK index.
    rerun_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="reruns", db_index=False
    )
    # For a compensation run (tasks.compensation): the action of its canceled ``rerun_of`` task that
    # it undoes. One run at a time per action, and none once one completed (the constraint below).
    compensates = models.ForeignKey(
        "ledger.Action",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="compensation_runs",
        db_index=False,
    )

    state = models.CharField(max_length=24, choices=State.choices, default=State.READY)
    state_version = models.PositiveIntegerField(default=1)
    # Machine-readable reason for the current state (e.g. "checkpoint_corrupt").
    state_reason = models.CharField(max_length=64, blank=True, default="")
    outcome = models.JSONField(null=True, blank=True)  # terminal detail

    objective = models.TextField()
    input = models.JSONField(default=dict)  # validated by the task type's input model
    # NULL, not "", for "no key": the partial unique constraint below skips NULLs.
    idempotency_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001
    # SHA-256 of the creation request, so a reused key with a different body is refused.
    request_digest = models.CharField(max_length=64, blank=True, default="")

    deadline = models.DateTimeField(null=True, blank=True)
    wait_deadline = models.DateTimeField(null=True, blank=True)
    attempt = models.PositiveIntegerField(default=0)
    policy_version = models.CharField(max_length=64)
    model_id = models.CharField(max_length=128, blank=True, default="")
    prompt_id = models.CharField(max_length=128, blank=True, default="")
    toolset_id = models.CharField(max_length=128, blank=True, default="")

    escalation_level = models.PositiveSmallIntegerField(default=0)
    escalated_to = models.CharField(max_length=16, blank=True, default="")
    escalation_reason = models.TextField(blank=True, default="")

    # Hash of the newest audit event: the head of this task's hash chain. It moves
    # under the same compare-and-set as state_version, so the chain cannot fork.
    audit_head = models.CharField(max_length=64, blank=True, default="")
    # Hash of the newest chained lease takeover ("" while none): the head of the task's takeover
    # chain (audit.chain.verify_takeovers). Moved only by a claim, under the task row's lock. A database
    # default too: rows inserted by SQL (the benches, older deployments' workers) start with none.
    takeover_head = models.CharField(max_length=64, blank=True, default="", db_default="")

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    state_entered_at = models.DateTimeField()

    class Meta:
        constraints = [
            # POST /api/tasks/ with an idempotency key: same key, same task, per tenant.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="task_unique_idempotency_key",
            ),
            # A second compensation of the same effect may start only once every earlier run ended
            # without completing (failed, canceled, expired): a double click or a race starts one.
            models.UniqueConstraint(
                fields=["compensates"],
                condition=Q(compensates__isnull=False) & ~Q(state__in=sorted(ENDED_UNDONE)),
                name="task_one_compensation_run",
            ),
            models.CheckConstraint(condition=Q(state__in=State.values), name="task_state_known"),
            models.CheckConstraint(condition=Q(state_version__gte=1), name="task_version_positive"),
            # Every wait has an expiry: nothing may wait forever unnoticed.
            models.CheckConstraint(
                condition=~Q(state__in=sorted(WAITING)) | Q(wait_deadline__isnull=False),
                name="task_wait_has_deadline",
            ),
        ]
        indexes = [
            # GET /api/tasks/ (newest first, keyset on id) and its filters.
            models.Index(fields=["tenant", "-id"], name="task_tenant_id"),
            models.Index(fields=["tenant", "state", "-id"], name="task_tenant_state_id"),
            models.Index(fields=["tenant", "task_type", "-id"], name="task_tenant_type_id"),
            # The console queue sorted by age in state (keyset on state_entered_at, id) and its
            # "in state over" filter. The search's trigram index lives in migration 0005 only
            # (PostgreSQL; an expression the SQLite demo cannot build).
            models.Index(fields=["tenant", "state_entered_at", "id"], name="task_tenant_entered"),
            # Per-state reads ordered by age: the dashboard's and /metrics' age-in-state buckets and
            # oldest waits, the alerts scan's quarantined / cancel_requested / outcome_unknown checks.
            # One ordered range per state instead of a walk past every finished task.
            models.Index(
                fields=["tenant", "state", "state_entered_at"],
                include=["task_type"],
                name="task_tenant_state_entered",
            ),
            # Workers' claim query: runnable tasks of a region, longest waiting first.
            models.Index(
                fields=["region", "state_entered_at"],
                condition=Q(state__in=sorted(RUNNABLE)),
                name="task_runnable",
            ),
            # The alerts scan's overdue states (``runtime.alerts``: quarantined, cancel requested, outcome
            # unknown) by age: only the tasks in those states have an entry, so the scan never reads the
            # ended ones (a state change rewrites these columns anyway: no entry for a step commit).
            models.Index(
                fields=["state", "state_entered_at"],
                condition=Q(state__in=sorted(ALERT_OVERDUE_STATES)),
                name="task_alert_overdue",
            ),
            # Sweeps: waits past their deadline.
            models.Index(
                fields=["wait_deadline"],
                condition=Q(wait_deadline__isnull=False),
                name="task_wait_deadline",
            ),
            # The references, for the rows that have one (most have none: a NULL entry per task and
            # per state change would be written for nothing). ``x = value`` lookups use them.
            *(
                models.Index(fields=[name], condition=Q(**{f"{name}__isnull": False}), name=f"task_{name}")
                for name in REFERENCES
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_type} {self.id} [{self.state} v{self.state_version}]"


class Checkpoint(models.Model):
    """The encoded checkpoint written with one transition.

    ``body`` holds the bytes exactly as the codec wrote them; decoding (and
    migrating, or quarantining) happens in ``tasks.checkpoints``, never here.
    ``digest`` is the SHA-256 of ``body``; the audit event of the same version
    records it too, so an edited body (or digest) is refused on load.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="checkpoints")
    state_version = models.PositiveIntegerField()
    schema_version = models.PositiveIntegerField()
    codec = models.CharField(max_length=32)
    body = models.TextField()
    # "" only on rows written before checkpoints carried digests (still readable).
    digest = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "state_version"], name="checkpoint_one_per_version"),
        ]

    def __str__(self) -> str:
        return f"checkpoint {self.task_id} v{self.state_version} (schema {self.schema_version})"


class Lease(models.Model):
    """Which worker may currently advance a task; separate from business state.

    A lease that lapses changes nothing about the task: it only lets another
    worker claim it. ``token`` grows with every claim and fences writes: the
    transition primitive refuses a write carrying an older token.
    """

    task = models.OneToOneField(Task, primary_key=True, on_delete=models.CASCADE, related_name="lease")
    worker_id = models.CharField(max_length=200)
    token = models.PositiveBigIntegerField()
    acquired_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    # The holder process's liveness lock (tasks.liveness): while the lease has not expired, it is
    # live only if that lock is still held. NULL: no such lock (SQLite, liveness off): TTL only.
    holder_key = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            # The sweep's "eligible task without a live lease" anti-join, and lease-expiry reports.
            models.Index(fields=["expires_at"], name="lease_expires_at"),
        ]

    def __str__(self) -> str:
        return f"lease {self.task_id} #{self.token} by {self.worker_id} until {self.expires_at:%H:%M:%S}"


class ExternalEvent(models.Model):
    """An event an outside system delivered for a task; ``event_key`` makes delivery idempotent."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="external_events")
    event_key = models.CharField(max_length=200)
    event_type = models.CharField(max_length=100)
    payload = models.JSONField(default=dict)
    received_at = models.DateTimeField()
    # The task version this event moved the task to, when it ended a wait.
    applied_version = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "event_key"], name="external_event_once"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} {self.event_key} for {self.task_id}"


class TaskSearch(models.Model):
    """A task's search document (``reads.queue``), kept apart from its row.

    The document (id, objective, idempotency key, input) never changes once the task exists, but a
    trigram index on ``tasks_task`` took ~56 new entries at every change of state, the bulk of a
    transition's index writes. Here the row is written once. On PostgreSQL, triggers on
    ``tasks_task`` write it (every insert path, raw SQL included), rewrite it if those columns ever
    change, and delete it with its task (migration ``tasks/0017``); the trigram index
    ``task_search_doc_trgm`` is on ``UPPER(doc)``. On SQLite (the demo) the table stays empty and
    the queue's search scans the tasks themselves.
    """

    # No foreign key constraint: the triggers keep the two in step, and retention's deletes of
    # tasks need no extra statement from Django's collector.
    task = models.OneToOneField(
        Task, primary_key=True, on_delete=models.DO_NOTHING, db_constraint=False, related_name="+"
    )
    doc = models.TextField()

    class Meta:
        db_table = "tasks_task_search"

    def __str__(self) -> str:
        return f"search document of {self.task_id}"


class TaskInput(models.Model):
    """An answer to ``waiting_input``; one per waiting version, so a repeated post applies once."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="inputs")
    answered_version = models.PositiveIntegerField()
    payload = models.JSONField()
    payload_digest = models.CharField(max_length=64)
    submitted_by = models.CharField(max_length=200)
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "answered_version"], name="task_input_once_per_wait"),
        ]

    def __str__(self) -> str:
        return f"input for {self.task_id} at v{self.answered_version}"


class Policy(models.Model):
    """The policy version in force for a task type; admins change it, resumes revalidate against it."""

    task_type = models.CharField(max_length=64, unique=True)
    version = models.CharField(max_length=64)
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.CharField(max_length=150, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.task_type} policy {self.version}"


class RuntimeConfig(models.Model):
    """A (model, prompt, tool set) combination approved — or no longer — for a task type."""

    task_type = models.CharField(max_length=64)
    model_id = models.CharField(max_length=128)
    prompt_id = models.CharField(max_length=128)
    toolset_id = models.CharField(max_length=128)
    approved = models.BooleanField(default=True)
    # The one configuration new tasks and replans of this type use.
    current = models.BooleanField(default=False)
    changed_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task_type", "model_id", "prompt_id", "toolset_id"], name="runtime_config_unique"
            ),
            models.UniqueConstraint(
                fields=["task_type"], condition=Q(current=True), name="runtime_config_one_current"
            ),
            models.CheckConstraint(
                condition=~Q(current=True) | Q(approved=True), name="runtime_config_current_approved"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_type}: {self.model_id} / {self.prompt_id} / {self.toolset_id}"


# --- retention (protection.retention; docs/operating/retention.md) ----------------------------------------


class RetentionPolicy(models.Model):
    """How long a tenant keeps its ended tasks of one type, or of every type (``task_type`` blank).

    The most specific policy wins: the tenant's policy for the task's type, else its policy for
    every type, else the defaults (``RETENTION_ARCHIVE_AFTER_DAYS``, ``RETENTION_DELETE_AFTER_DAYS``).
    Days count from the moment the task ended; empty means never. A policy states both numbers.
    """

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    task_type = models.CharField(
        max_length=64, blank=True, default="", help_text="Blank: every type of the tenant without its own"
    )
    archive_after_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Erase sealed values this many days after the task ended; empty: never",
    )
    delete_after_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Delete the task (leaving a tombstone) this many days after it ended; empty: never",
    )
    changed_at = models.DateTimeField(auto_now=True)
    changed_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        verbose_name_plural = "retention policies"
        constraints = [
            # protection.retention.TenantRules reads a tenant's policies by this index.
            models.UniqueConstraint(fields=["tenant", "task_type"], name="retention_policy_once"),
            models.CheckConstraint(
                condition=Q(archive_after_days__isnull=True) | Q(archive_after_days__gte=1),
                name="retention_archive_days_positive",
            ),
            models.CheckConstraint(
                condition=Q(delete_after_days__isnull=True) | Q(delete_after_days__gte=1),
                name="retention_delete_days_positive",
            ),
            # Archiving after deleting would never happen: a policy saying so is a mistake.
            models.CheckConstraint(
                condition=Q(archive_after_days__isnull=True)
                | Q(delete_after_days__isnull=True)
                | Q(delete_after_days__gte=F("archive_after_days")),
                name="retention_delete_not_before_archive",
            ),
        ]

    def __str__(self) -> str:
        archive = f"archive after {self.archive_after_days} d" if self.archive_after_days else "never archive"
        delete = f"delete after {self.delete_after_days} d" if self.delete_after_days else "never delete"
        return f"{self.tenant_id}/{self.task_type or '*'}: {archive}, {delete}"


class LegalHold(models.Model):
    """A legal hold on a task: while one is in force, retention neither archives nor deletes it.

    One row per hold, kept when it is lifted: who placed it and why, who lifted it and why. The
    rows are the record of every hold (shown on the task page and by the API); on PostgreSQL a
    trigger (migration 0008) lets a row change only by being lifted, and leave only with its task
    on the owner's retention path. Placed and lifted through ``protection.holds.set_legal_hold``.
    """

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="legal_holds")
    placed_by = models.CharField(max_length=150)  # the user name, which outlives the account
    reason = models.TextField()
    placed_at = models.DateTimeField()
    lifted_by = models.CharField(max_length=150, blank=True, default="")
    lift_reason = models.TextField(blank=True, default="")
    lifted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # At most one hold in force per task; also the index of retention's "no hold in force"
            # anti-join and of set_legal_hold's lookup.
            models.UniqueConstraint(
                fields=["task"], condition=Q(lifted_at__isnull=True), name="legal_hold_one_in_force"
            ),
        ]
        indexes = [
            # The task page's and the API's history of a task's holds, newest first.
            models.Index(fields=["task", "-placed_at"], name="legal_hold_task_placed"),
        ]

    def __str__(self) -> str:
        lifted = f", lifted {self.lifted_at:%Y-%m-%d} by {self.lifted_by}" if self.lifted_at else ""
        return f"hold on {self.task_id} by {self.placed_by}{lifted}"


class Archive(models.Model):
    """Retention archived this task: its sealed values erased, the evidence of what it did kept.

    A row of its own rather than a column on ``Task``: every transition reads the task row, and
    archiving happens once in a task's life, after its last transition.
    """

    task = models.OneToOneField(Task, primary_key=True, on_delete=models.CASCADE, related_name="archive")
    archived_at = models.DateTimeField()
    rule = models.CharField(max_length=200)  # the policy that made it due, in words
    erased = models.PositiveIntegerField()  # sealed values erased across the task's rows

    def __str__(self) -> str:
        return f"{self.task_id} archived {self.archived_at:%Y-%m-%d} ({self.erased} values erased)"


class CancelScope(models.TextChoices):
    """What a cancel request stops (DESIGN, "Timeout, cancellation, failure")."""

    # Widest first: a form offering them preselects the first.
    TASK = "task"  # the whole task, its children with it: `cancel_requested`, then `canceled`
    CHILDREN = "children"  # every child task still running; the parent goes on with what they ended with
    TOOL_CALL = "tool_call"  # the side effect not yet sent; one already sent is reconciled, not unsent
    MODEL_TURN = "model_turn"  # the model turn in flight (or about to start); the task goes on after it


class CancelRequest(models.Model):
    """One cancel request, whatever its scope: who asked, when, at which version, and what came of it.

    A ``task`` request is also a transition (to ``cancel_requested``); the narrower scopes change no
    state when made: a worker applies them between steps (or interrupts a model turn in flight), and
    records here what it did. Written through ``tasks.cancellation`` only.
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        APPLIED = "applied"
        NO_EFFECT = "no_effect"  # nothing of that scope was in flight, or it had already happened

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="cancel_requests")
    scope = models.CharField(max_length=16, choices=CancelScope.choices)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    requested_by = models.CharField(max_length=200)
    reason = models.TextField()
    requested_version = models.PositiveIntegerField()
    requested_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.TextField(blank=True, default="")

    class Meta:
        constraints = [
            # One open request per scope: asking again while one waits changes nothing.
            models.UniqueConstraint(
                fields=["task", "scope"], condition=Q(status="pending"), name="cancel_request_one_pending"
            ),
        ]

    def __str__(self) -> str:
        return f"cancel {self.scope} of {self.task_id} [{self.status}]"
