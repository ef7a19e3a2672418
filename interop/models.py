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
