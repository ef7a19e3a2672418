"""Bulk operator actions: one record per batch, one result per task.

A ``BulkOperation`` is what an operator confirmed: a control, one reason, and
the exact set of tasks at the versions they had when it was confirmed (its
``BulkResult`` rows, written ``pending`` at confirmation). Running it fills each
result once (``pending`` → applied / unchanged / refused / stale) and moves the
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
