"""What we keep of A2A callers: each message that started or answered one of our tasks.

The row is the idempotency record (the same ``messageId`` from the same tenant acts once; sent again
with different content it is refused) and what the console shows of a task started over A2A: the
calling client, its context id. It is never the authority over the task: that stays the task row,
its checkpoints, its ledger and its audit chain.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class A2AMessage(models.Model):
    class Kind(models.TextChoices):
        START = "start"  # started a new task
        ANSWER = "answer"  # answered the task's ``waiting_input``

    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    message_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="a2a_messages")
    context_id = models.CharField(max_length=200)
    # SHA-256 of the message's canonical content: the same id with other content is a conflict.
    digest = models.CharField(max_length=64)
    caller = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    token = models.ForeignKey("tenancy.ApiToken", null=True, on_delete=models.SET_NULL, related_name="+")
    user_agent = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "message_id"], name="a2a_message_once_per_tenant"),
        ]
        indexes = [
            models.Index(fields=["tenant", "context_id", "-id"], name="a2a_message_context"),
            models.Index(fields=["task", "id"], name="a2a_message_task"),
        ]

    def __str__(self) -> str:
        return f"A2A {self.kind} {self.message_id} -> {self.task_id}"


class PushConfig(models.Model):
    """Where a caller wants each status change of one task POSTed (A2A ``TaskPushNotificationConfig``).

    ``secrets`` holds the token and the authentication credentials, each sealed for this row
    (``audit.sealing``, place ``["push", id, <name>]``); nothing else of the row is secret. ``cursor``
    is the last task version for which a ``PushDelivery`` was written: ``interop.push.enqueue`` walks the
    task's transition log past it, so a status change committed while every worker was dead is
    delivered later, never lost. A deleted config keeps its rows (the console shows its history) and
    gets no new delivery.
    """

    id = models.UUIDField(primary_key=True)  # chosen in code: the sealed secrets name it
    tenant = models.ForeignKey("tenancy.Tenant", on_delete=models.PROTECT, related_name="+")
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="push_configs")
    config_id = models.CharField(max_length=200)  # the caller's name for it (A2A ``id``)
    url = models.URLField(max_length=2048)
    auth_scheme = models.CharField(max_length=64, blank=True, default="")
    secrets = models.JSONField(default=dict)  # {"token": envelope, "credentials": envelope}
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)
    cursor = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["task", "config_id"],
                condition=models.Q(deleted_at__isnull=True),
                name="push_config_one_live_id_per_task",
            ),
        ]
        indexes = [
            # interop.push.enqueue: live configs whose task moved past the cursor.
            models.Index(
                fields=["task"], condition=models.Q(deleted_at__isnull=True), name="push_config_live"
            ),
        ]

    def __str__(self) -> str:
        return f"push {self.config_id} of {self.task_id}"


class PushDelivery(models.Model):
    """One status change (task version) to deliver to one config: the outbox row of a push.

    Written by ``interop.push.enqueue`` from the transition log; sent by ``interop.push.deliver_due``,
    in version order per config, at least once. ``idempotency_id`` (``<task>:<state_version>``) is
    what the receiver deduplicates on. ``changed_at`` (the transition's time) and ``delivered_at``
    give the latency from a status change to its delivery (the bench reads them).
    """

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after A2A_PUSH_MAX_ATTEMPTS (or the URL is refused now)

    config = models.ForeignKey(PushConfig, on_delete=models.CASCADE, related_name="deliveries")
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="+")
    state_version = models.PositiveIntegerField()
    idempotency_id = models.CharField(max_length=80)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.PositiveIntegerField(null=True, blank=True)  # the receiver's HTTP status
    last_error = models.TextField(blank=True, default="")
    changed_at = models.DateTimeField()
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["config", "state_version"], name="push_delivery_once_per_version"
            ),
        ]
        indexes = [
            # deliver_due: the pending rows whose time has come.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(status="pending"),
                name="push_delivery_due",
            ),
            # The task page: a config's newest deliveries.
            models.Index(fields=["config", "-state_version"], name="push_delivery_config"),
        ]

    def __str__(self) -> str:
        return f"push {self.idempotency_id} -> {self.config_id} ({self.status})"
