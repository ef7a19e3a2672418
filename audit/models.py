"""The append-only transition log.

One row per committed transition, hash-chained per task (``prev_hash`` ->
``hash``) so that editing, deleting or inserting a row is detectable by
``audit.chain.verify_task`` / ``manage.py verify_audit``. On PostgreSQL a
trigger (migration 0002) refuses UPDATE and DELETE outright.
"""

from __future__ import annotations

from django.db import models


class TransitionEvent(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.PROTECT, related_name="events")
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    # The version the task reached with this transition (the creation event is 1).
    state_version = models.PositiveIntegerField()
    from_state = models.CharField(max_length=24, blank=True, default="")  # "" for creation
    to_state = models.CharField(max_length=24)
    trigger = models.CharField(max_length=32)
    actor_kind = models.CharField(max_length=16)
    actor_id = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    reason_code = models.CharField(max_length=64, blank=True, default="")
    attempt = models.PositiveIntegerField()
    policy_version = models.CharField(max_length=64)
    parent_id = models.UUIDField(null=True, blank=True)
    trace_id = models.CharField(max_length=32, blank=True, default="")
    created_at = models.DateTimeField()
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64)

    class Meta:
        constraints = [
            # One event per version: a second commit from the same version cannot exist.
            models.UniqueConstraint(fields=["task", "state_version"], name="event_one_per_version"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} v{self.state_version} {self.from_state or '∅'}->{self.to_state}"
