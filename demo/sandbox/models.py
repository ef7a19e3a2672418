"""Simulated authoritative systems (payments, tickets, email, orders).

They keep their own tables and are only ever reached over HTTP, so the
product meets real timeouts and ambiguous answers. Nothing outside
``sandbox/`` imports these models.
"""

from __future__ import annotations

from django.db import models


class Record(models.Model):
    """A record an agent reads as evidence (an order, an account)."""

    system = models.CharField(max_length=32)
    record_id = models.CharField(max_length=200)
    version = models.PositiveIntegerField(default=1)
    data = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["system", "record_id"], name="sandbox_record_unique")]

    def __str__(self) -> str:
        return f"{self.system}/{self.record_id} v{self.version}"


class Effect(models.Model):
    """A side effect the system performed, at most once per idempotency key."""

    system = models.CharField(max_length=32)
    idempotency_key = models.CharField(max_length=200)
    status = models.CharField(max_length=16, default="succeeded")
    record_version = models.PositiveIntegerField(default=1)
    request = models.JSONField(default=dict)
    # How many requests arrived with this key (replays included): tests use it to
    # prove a fenced-off worker sent nothing, whatever the system's deduplication hid.
    deliveries = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["system", "idempotency_key"], name="sandbox_effect_unique")
        ]

    def __str__(self) -> str:
        return f"{self.system} {self.idempotency_key} [{self.status}]"


class Fault(models.Model):
    """A queued fault: the next ``remaining`` calls of ``operation`` on ``system`` misbehave.

    kinds: ``latency`` (params.ms), ``timeout`` (commit, then hang past the
    caller's patience), ``ambiguous`` (commit, then answer 502), ``error``
    (answer 503 without committing), ``reject`` (answer 422, a definite no).
    """

    system = models.CharField(max_length=32)
    operation = models.CharField(max_length=16, default="dispatch")  # dispatch | lookup | read
    kind = models.CharField(max_length=16)
    remaining = models.PositiveIntegerField(default=1)
    params = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.kind} x{self.remaining} on {self.system}.{self.operation}"
