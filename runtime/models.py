"""Bulk operator actions: one record per batch, one result per task.

A ``BulkOperation`` is what an operator confirmed: a control, one reason, and
the exact set of tasks at the versions they had when it was confirmed (its
``BulkResult`` rows, written ``pending``: by the confirmation itself for an operation run in the
request, by the first runner for a larger one, from the ``BulkSnapshot`` the confirmation took).
Running it fills each result once (``pending`` → applied / unchanged / refused / stale) and moves the
operation's counters; nothing rewrites a settled result. Each applied control is
also an ordinary transition with its own audit event naming the operation.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from tasks.ids import uuid7


class BulkStatus(models.TextChoices):
    QUEUED = "queued"  # confirmed, waiting for a worker (large operations)
    RUNNING = "running"
    DONE = "done"


class Outcome(models.TextChoices):
    PENDING = "pending"
    APPLIED = "applied"
    UNCHANGED = "unchanged"  # the control's outcome already held (e.g. cancel on cancel_requested)
    REFUSED = "refused"  # not possible from the task's state, or no operator role in its tenant
    STALE = "stale"  # the task moved on since the operator confirmed: never overwritten


class BulkOperation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Kept as text too: the record outlives the account.
    created_by_name = models.CharField(max_length=150)
    created_at = models.DateTimeField()
    control = models.CharField(max_length=16)
    reason = models.TextField()
    scope = models.CharField(max_length=16, blank=True, default="")  # cancel only
    escalate_to = models.CharField(max_length=16, blank=True, default="")  # escalate only
    # What was selected: {"query": "<the queue's filter query string>"} or {"ids": [...]}.
    selection = models.JSONField(default=dict)
    total = models.PositiveIntegerField()
    status = models.CharField(max_length=8, choices=BulkStatus.choices, default=BulkStatus.QUEUED)
    # Progress, moved with each chunk of results (the results are the truth; these are for the page).
    done = models.PositiveIntegerField(default=0)
    applied = models.PositiveIntegerField(default=0)
    unchanged = models.PositiveIntegerField(default=0)
    refused = models.PositiveIntegerField(default=0)
    stale = models.PositiveIntegerField(default=0)
    # Who is running it and since when: a runner that died leaves a heartbeat others may take over.
    runner = models.CharField(max_length=200, blank=True, default="")
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # run_worker's pick-up: operations not finished, oldest first.
            models.Index(fields=["created_at"], condition=~Q(status="done"), name="bulk_unfinished"),
        ]

    def __str__(self) -> str:
        return f"bulk {self.control} x{self.total} by {self.created_by_name} [{self.status}]"


class BulkResult(models.Model):
    operation = models.ForeignKey(BulkOperation, on_delete=models.PROTECT, related_name="results")
    # No foreign key: a result outlives the task's retention.
    task_id = models.UUIDField()
    tenant_id = models.IntegerField()
    expected_version = models.PositiveIntegerField()  # the version the operator confirmed
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.PENDING)
    detail = models.TextField(blank=True, default="")
    state_after = models.CharField(max_length=24, blank=True, default="")
    version_after = models.PositiveIntegerField(null=True, blank=True)
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["operation", "task_id"], name="bulk_result_once_per_task"),
        ]
        indexes = [
            # The runner's next chunk (pending, in id order) and the report's per-outcome lists.
            models.Index(fields=["operation", "outcome", "id"], name="bulk_result_outcome"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} v{self.expected_version}: {self.outcome}"


class BulkSnapshot(models.Model):
    """What a large operation's confirmation selected, in one row, until its first runner writes it
    out as ``pending`` results (and deletes this row, in the same transaction).

    ``body`` is ``[[task id, tenant id, version], …]`` in task id order, built by the database from the
    selection's own query (``runtime.bulk``): one row written in the request however many tasks match,
    where one result row per task (and its index entries) cost the request seconds per 50,000 tasks.
    The runner needs no filter of the queue to write the results: the selection was resolved at
    confirmation.

    ``tenant_ids`` is the distinct tenants of ``body`` (``[tenant id, …]``), written by the same
    statement: until the results are written, it is what says who may read the operation besides its
    creator (``console.bulk``), without reading ``body``.
    """

    operation = models.OneToOneField(
        BulkOperation, primary_key=True, on_delete=models.CASCADE, related_name="snapshot"
    )
    body = models.JSONField()
    tenant_ids = models.JSONField(default=list)

    def __str__(self) -> str:
        return f"snapshot of {self.operation_id}"


class AlertKind(models.TextChoices):
    """Why nobody will move a task unless someone looks (each has a classifier in ``runtime.alerts``)."""

    NO_LIVE_LEASE = "no_live_lease", "runnable, no worker holds it"
    WAIT_PAST_DEADLINE = "wait_past_deadline", "wait past its deadline"
    UNKNOWN_OUTCOME_OVERDUE = "unknown_outcome_overdue", "outcome unknown too long"
    QUARANTINE_OVERDUE = "quarantine_overdue", "quarantined too long"
    CANCEL_UNCONFIRMED = "cancel_unconfirmed", "cancel not confirmed"
    EFFECT_DIGEST_MISMATCH = "effect_digest_mismatch", "effect not as intended, held unsent"
    # Of a tenant, not a task: effects a system holds that no ledger row explains (``manage.py recover``).
    ORPHAN_EFFECTS_OPEN = "orphan_effects_open", "effects found after a restore, unexplained"
    PUSH_RECEIVER_FAILING = "push_receiver_failing", "A2A push receiver keeps failing"


class Alert(models.Model):
    """One raised alert: a task (or, later, something else of a tenant) with no valid next event coming.

    ``runtime.alerts.scan`` writes and clears these; people only acknowledge and
    snooze them (each an ``AlertNote``). An alert stays open until the scan finds
    the task moved on (a transition other than an escalation since
    ``state_version``) or the condition gone; then ``cleared_at`` is set and a
    later recurrence is a new alert.
    """

    id = models.BigAutoField(primary_key=True)  # raised by INSERT … SELECT: ids come from the database
    # No index of its own: ``alert_tenant_id`` leads with the tenant (PROTECT's check reads it).
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+", db_index=False)
    task = models.ForeignKey(
        "tasks.Task", null=True, blank=True, on_delete=models.CASCADE, related_name="alerts"
    )
    kind = models.CharField(max_length=32, choices=AlertKind.choices)
    cause = models.TextField()  # in words, for the person who reads it
    raised_at = models.DateTimeField()
    cleared_at = models.DateTimeField(null=True, blank=True)
    state_version = models.PositiveIntegerField(null=True, blank=True)  # the task's, when raised
    # The first acknowledgement; every later one is an AlertNote too.
    # Unindexed: nothing reads alerts by who acknowledged them, and the index cost every raised alert a
    # write; deleting a user (rare) scans the table to clear the reference.
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    acknowledged_by_name = models.CharField(max_length=150, blank=True, default="")  # outlives the account
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledgement_note = models.TextField(blank=True, default="")
    snoozed_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Raised once: the scan's INSERT … ON CONFLICT DO NOTHING leans on this, and its
            # "no open alert yet" anti-join and the clearing probe read it.
            models.UniqueConstraint(
                fields=["task", "kind"], condition=Q(cleared_at__isnull=True), name="alert_one_open_per_kind"
            ),
            # A tenant's alert (no task): one open per kind too (two scans racing insert once).
            models.UniqueConstraint(
                fields=["tenant", "kind"],
                condition=Q(task__isnull=True, cleared_at__isnull=True),
                name="alert_one_open_per_tenant_kind",
            ),
            models.CheckConstraint(condition=Q(kind__in=AlertKind.values), name="alert_kind_known"),
        ]
        indexes = [
            # GET /api/alerts/ and /console/alerts/: a tenant's alerts newest first (keyset on id).
            models.Index(fields=["tenant", "-id"], name="alert_tenant_id"),
            # The navigation badge and the "open" filter: only open alerts, a small part of the table.
            models.Index(fields=["tenant", "-id"], condition=Q(cleared_at__isnull=True), name="alert_open"),
        ]

    def __str__(self) -> str:
        status = "open" if self.cleared_at is None else "cleared"
        return f"{self.kind} {self.task_id} v{self.state_version} ({status})"


class AlertNote(models.Model):
    """What a person did about an alert: acknowledged it, or snoozed it until a time. Append-only.

    The audit record of alert handling (on PostgreSQL the table refuses UPDATE and
    DELETE, runtime migration 0003): every acknowledgement and snooze with who,
    when and the note, even when the alert already carried an earlier one.
    """

    class Kind(models.TextChoices):
        ACKNOWLEDGE = "acknowledge"
        SNOOZE = "snooze"

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notes")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    by_name = models.CharField(max_length=150)  # kept as text: the record outlives the account
    at = models.DateTimeField()
    note = models.TextField(blank=True, default="")
    snoozed_until = models.DateTimeField(null=True, blank=True)  # snooze only

    class Meta:
        indexes = [models.Index(fields=["alert", "at"], name="alertnote_alert_at")]

    def __str__(self) -> str:
        return f"{self.kind} of alert {self.alert_id} by {self.by_name}"


class ModelUsage(models.Model):
    """What one model turn cost: the tokens the endpoint counted and their price. Append-only.

    Written by the worker in the transaction of the transition that follows the turn
    (``runtime.usage.record``), so a turn whose transition never committed (a stale version,
    a lost lease, a crash) leaves no row, and one that did leaves exactly one: the transition
    from a version commits once. ``committed`` tells an answer the task kept from one it refused
    (``llm.ModelOutputInvalid``): the endpoint billed both. Turns that raised before answering
    (timeouts, errors, cancels) report no usage and record none.

    ``cost`` is ``tokens × price`` from ``settings.MODEL_PRICES`` when the turn was recorded, in the
    table's currency; NULL when the model has no price or the endpoint gave no counts (unpriced,
    never a 0 that looks free).
    """

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="model_usages")
    step = models.CharField(max_length=128)
    state_version = models.PositiveIntegerField()  # the version the turn was decided from
    attempt = models.PositiveIntegerField()  # the task's attempt then: 0 first, then one per retry
    model_id = models.CharField(max_length=128)  # the model that answered, as the endpoint named it
    input_tokens = models.PositiveIntegerField(null=True, blank=True)  # NULL: not reported
    output_tokens = models.PositiveIntegerField(null=True, blank=True)
    cost = models.DecimalField(max_digits=24, decimal_places=12, null=True, blank=True)
    committed = models.BooleanField()  # the answer was kept with the transition
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [
            # One turn per version: the compare-and-set lets one transition leave a version; the task
            # detail's totals sum a task's rows through this index.
            models.UniqueConstraint(fields=["task", "state_version"], name="model_usage_one_per_turn"),
        ]

    def __str__(self) -> str:
        return (
            f"{self.task_id} v{self.state_version} {self.model_id}: {self.input_tokens}/{self.output_tokens}"
        )


# --- agent runs (runtime.sdk) ----------------------------------------------------------------------


class AgentTurn(models.Model):
    """One model turn of an agent run, as the model answered it: recorded once, replayed ever after.

    Committed with the transition that follows the turn (``runtime.sdk.step``), so a turn is either
    recorded or was never taken; a run rebuilt after a crash replays it instead of asking the model
    again. ``response`` is the turn's output items and usage, sealed whole to the task (a transcript
    may hold anything the customer wrote); ``register_json_column`` lets rotation and retention reach it.
    """

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="agent_turns")
    step = models.CharField(max_length=64)  # the AgentRun step
    turn = models.PositiveIntegerField()  # 1, 2, ... over the whole run
    agent = models.CharField(max_length=128)  # the agent that was asked (handoffs change it)
    model_id = models.CharField(max_length=128)
    response = models.JSONField()  # {"items": [...], "usage": {...}}, sealed
    state_version = models.PositiveIntegerField()  # the version the turn was decided from
    recorded_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "step", "turn"], name="agent_turn_once"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} {self.step} turn {self.turn} ({self.agent})"


class AgentSnapshot(models.Model):
    """The SDK's own serialized run state at a pause (``RunState.to_string``): an artifact, never the
    authority. Stored server-side with the SDK's schema version and a MAC over the task, step, turn
    and body (``runtime.sdk.snapshots``); a resume that finds it altered, or written by a newer SDK
    schema than this worker reads, refuses it with a recorded reason. Where it disagrees with the
    ledger (a call it thinks has not run, the ledger says settled), the ledger wins. Append-only: the
    newest one of a task's step is where its run resumes.
    """

    id = models.BigAutoField(primary_key=True)
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="agent_snapshots")
    step = models.CharField(max_length=64)
    turns = models.PositiveIntegerField()  # model turns taken before the pause
    schema_version = models.CharField(max_length=16)  # the SDK's $schemaVersion
    sdk_version = models.CharField(max_length=32)  # the SDK that wrote it
    body = models.JSONField()  # the snapshot text, sealed
    size = models.PositiveIntegerField()  # bytes of the snapshot text
    mac = models.CharField(max_length=64)
    key_id = models.CharField(max_length=64)
    state_version = models.PositiveIntegerField()
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["task", "step", "-id"], name="agent_snapshot_latest")]

    def __str__(self) -> str:
        return f"{self.task_id} {self.step} after turn {self.turns} (schema {self.schema_version})"


class AgentSessionItem(models.Model):
    """One item of an agent's conversation memory (an Agents SDK session), sealed. Append-only.

    A session is a tenant's ``session_id`` and its items in ``position`` order; ``runtime.sdk.session``
    is the only writer. Items are added at the end and leave only from the end (``pop``) or all at once
    (``clear``); nothing rewrites one, so on PostgreSQL an UPDATE may change ``item`` alone (key rotation
    re-seals it, retention erases it: runtime migration 0008).

    ``item`` is the whole SDK input item as one envelope (``audit.sealing``), sealed to this row's
    tenant, session, position and id: a conversation is text someone typed or a model wrote, so none of
    it is kept in clear, and a token copied into another session or tenant is refused when read.

    ``task`` is the task whose run wrote the item, so retention finds the row through the model graph
    (archiving the task erases the item, deleting it deletes the row); NULL for code that drives the
    SDK outside a task, whose rows stay until it clears them.
    """

    id = models.UUIDField(primary_key=True, default=uuid7, editable=False)  # part of the sealed place
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    session_id = models.CharField(max_length=200)
    position = models.PositiveIntegerField()  # 0 first; the next append continues after the largest
    item = models.JSONField()  # {"$sealed": <key id>, "t": <token>}
    task = models.ForeignKey(
        "tasks.Task", null=True, blank=True, on_delete=models.PROTECT, related_name="session_items"
    )
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            # One item per place in a session: two appenders that both read the same last position
            # cannot both commit (the lock in runtime.sdk.session keeps them from trying). Its index
            # serves every read, newest first for a limit: (tenant, session_id) ORDER BY position.
            models.UniqueConstraint(
                fields=["tenant", "session_id", "position"], name="agent_session_item_position"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.session_id}#{self.position}"


class StateCount(models.Model):
    """How many tasks a tenant had in a state when ``runtime.rollups.refresh`` last counted them.

    A rollup, not a counter the transitions keep: the beat recounts every ``ROLLUP_INTERVAL`` seconds
    (one ``GROUP BY`` on the ``(tenant, state)`` index), so the transition path writes nothing more.
    Readers show the number with its age (``counted_at``).
    """

    tenant_id = models.IntegerField()  # no foreign key: a recount replaces every row at once
    state = models.CharField(max_length=24)
    n = models.BigIntegerField()
    counted_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "state"], name="state_count_once"),
        ]

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} {self.state}: {self.n}"


class Reading(models.Model):
    """A maintained reading kept in the database, so every web process serves the same one without a
    cold read: the dashboard's gauges (``runtime.rollups.refresh`` writes it with the state counts)."""

    name = models.CharField(max_length=32, primary_key=True)
    body = models.JSONField()
    read_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} read at {self.read_at:%H:%M:%S}"
