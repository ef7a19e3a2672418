"""Durable A2A push notifications: each status change of a task, POSTed to every live push config.

The outbox is the transition log itself: every transition commits its ``audit.TransitionEvent`` in
its own transaction, so a status change can never be lost, whatever dies afterwards. Delivery is two
steps, both safe to run in any number of processes at once and to kill at any point:

1. ``enqueue``: for each live ``PushConfig`` whose task's version passed its ``cursor``, write one
   ``PushDelivery`` per new version (``ON CONFLICT DO NOTHING`` on (config, version)), then move the
   cursor. A crash between the two writes the same rows again, which the constraint drops.
2. ``deliver_due``: claim the *first* pending delivery of each config (versions in order: a config's
   later change waits until the earlier one is delivered or given up) whose ``next_attempt_at`` came,
   by pushing ``next_attempt_at`` past the send's timeout in a short transaction (a lease, so no
   row lock is held across the network); then screen the URL again (``interop.ssrf``: DNS rebinding),
   POST, and record the outcome. A 2xx is delivered; anything else is retried after
   ``min(cap, base * 2**(attempts-1))`` seconds plus up to 50 % jitter, and after
   ``A2A_PUSH_MAX_ATTEMPTS`` marked failed (``runtime.alerts`` raises ``push_receiver_failing``).
   A worker killed after the POST and before the record sends it again: at least once, never at
   most once; the receiver deduplicates.

What is POSTed (``Content-Type: application/json``): ProtoJSON of an A2A ``StreamResponse`` holding a
``statusUpdate`` (``taskId``, ``contextId``, ``status.state``/``timestamp``, and ``metadata`` with our
``state``, ``stateVersion``, ``reasonCode``, ``needsPerson``). Headers:

- ``X-A2A-Notification-Token``: the config's token, as A2A receivers expect;
- ``X-Push-Idempotency-Id``: ``<task id>:<state_version>``, the same on every retry: deduplicate on it;
- ``X-Push-Signature``: ``sha256=<hex HMAC-SHA256 of the raw body, keyed with the token>``; a receiver
  recomputes it over the bytes it received and compares in constant time (``verify_signature``);
- ``Authorization: <scheme> <credentials>`` when the config carries authentication.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import httpx
from a2a.types import a2a_pb2
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone
from google.protobuf import json_format, struct_pb2, timestamp_pb2

from audit import sealing
from audit.models import TransitionEvent
from config import http
from interop import ssrf, states
from interop.models import A2AMessage, PushConfig, PushDelivery
from tasks.models import Task

log = logging.getLogger(__name__)

TOKEN_HEADER = "X-A2A-Notification-Token"
IDEMPOTENCY_HEADER = "X-Push-Idempotency-Id"
SIGNATURE_HEADER = "X-Push-Signature"
ERROR_SHOWN = 500  # characters of a receiver's failure kept on the row


# --- configs ----------------------------------------------------------------------------------------


def secret_place(config_id: uuid.UUID | str, name: str) -> sealing.Place:
    return ("push", str(config_id), name)


def create_config(
    task: Task,
    *,
    config_id: str,
    url: str,
    token: str = "",
    auth_scheme: str = "",
    credentials: str = "",
    created_by: Any = None,
) -> PushConfig:
    """A live push config for ``task``; ``ssrf.UrlRefused`` when ``url`` may not be sent to.

    The first delivery is the task's current status (the cursor starts one version back), so a
    receiver learns where the task stands before it hears of the next change."""
    ssrf.screen(url)
    pk = uuid.uuid4()
    secrets = {"token": sealing.seal(token, secret_place(pk, "token"))}
    if credentials:
        secrets["credentials"] = sealing.seal(credentials, secret_place(pk, "credentials"))
    return PushConfig.objects.create(
        id=pk,
        tenant_id=task.tenant_id,
        task=task,
        config_id=config_id,
        url=url,
        auth_scheme=auth_scheme,
        secrets=secrets,
        created_by=created_by,
        created_at=timezone.now(),
        cursor=max(task.state_version - 1, 0),
    )


def secret(config: PushConfig, name: str) -> str:
    envelope = config.secrets.get(name)
    if envelope is None:
        return ""
    return str(sealing.open_envelope(envelope, secret_place(config.pk, name)))


# --- the payload and its signature ----------------------------------------------------------------


def status_update(task: Task, event: TransitionEvent, context_id: str) -> a2a_pb2.StreamResponse:
    """One status change as A2A sees it: the state our table maps to, our own facts in metadata."""
    reading = states.reading(event.to_state)
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(event.created_at)
    metadata = struct_pb2.Struct()
    metadata.update(
        {
            "state": event.to_state,
            "stateVersion": event.state_version,
            "reasonCode": event.reason_code,
            "needsPerson": reading.needs_person,
        }
    )
    update = a2a_pb2.TaskStatusUpdateEvent(
        task_id=str(task.id),
        context_id=context_id,
        status=a2a_pb2.TaskStatus(state=reading.a2a, timestamp=stamp),  # type: ignore[arg-type]
        metadata=metadata,
    )
    return a2a_pb2.StreamResponse(status_update=update)


def body_of(message: a2a_pb2.StreamResponse) -> bytes:
    return json.dumps(json_format.MessageToDict(message), separators=(",", ":"), sort_keys=True).encode()


def signature(body: bytes, token: str) -> str:
    return "sha256=" + hmac.new(token.encode(), body, hashlib.sha256).hexdigest()


def verify_signature(body: bytes, token: str, header: str) -> bool:
    """What a receiver does: recompute over the raw bytes received, compare in constant time."""
    return hmac.compare_digest(signature(body, token), header)


def idempotency_id(task_id: Any, state_version: int) -> str:
    return f"{task_id}:{state_version}"


# --- step 1: the outbox from the transition log ---------------------------------------------------


def enqueue(*, now: datetime | None = None) -> int:
    """Write the deliveries of every status change past each live config's cursor; how many new."""
    now = now or timezone.now()
    written = 0
    behind = PushConfig.objects.filter(deleted_at__isnull=True, task__state_version__gt=F("cursor"))
    for config in behind.only("id", "task_id", "cursor"):
        events = list(
            TransitionEvent.objects.filter(task_id=config.task_id, state_version__gt=config.cursor)
            .order_by("state_version")
            .values_list("state_version", "created_at")
        )
        if not events:
            continue
        rows = [
            PushDelivery(
                config_id=config.pk,
                task_id=config.task_id,
                state_version=version,
                idempotency_id=idempotency_id(config.task_id, version),
                next_attempt_at=now,
                changed_at=changed_at,
                created_at=now,
            )
            for version, changed_at in events
        ]
        with transaction.atomic():
            written += len(PushDelivery.objects.bulk_create(rows, ignore_conflicts=True))
            # Only forward: two enqueuers racing never move the cursor back.
            PushConfig.objects.filter(pk=config.pk, cursor__lt=events[-1][0]).update(cursor=events[-1][0])
    return written


# --- step 2: sending ------------------------------------------------------------------------------


def backoff(attempts: int) -> timedelta:
    delay = min(settings.A2A_PUSH_BACKOFF_CAP, settings.A2A_PUSH_BACKOFF_BASE * 2 ** max(attempts - 1, 0))
    return timedelta(seconds=delay * (1 + random.random() * 0.5))  # noqa: S311 (jitter, not a secret)


def _claim(limit: int, now: datetime) -> list[PushDelivery]:
    """The first pending delivery of up to ``limit`` configs, due now, leased past one send."""
    earlier = PushDelivery.objects.filter(
        config_id=OuterRef("config_id"),
        status=PushDelivery.Status.PENDING,
        state_version__lt=OuterRef("state_version"),
    )
    with transaction.atomic():
        rows = list(
            PushDelivery.objects.filter(status=PushDelivery.Status.PENDING, next_attempt_at__lte=now)
            .filter(~Exists(earlier), config__deleted_at__isnull=True)
            .order_by("next_attempt_at", "id")
            .select_for_update(skip_locked=True, of=("self",))[:limit]
        )
        lease = now + timedelta(seconds=settings.A2A_PUSH_TIMEOUT * 3)
        PushDelivery.objects.filter(pk__in=[row.pk for row in rows]).update(next_attempt_at=lease)
    return rows


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status: int | None
    error: str
    final: bool = False  # no retry can help (the URL is refused now)


def _send(delivery: PushDelivery) -> Outcome:
    config = PushConfig.objects.get(pk=delivery.config_id)
    task = Task.objects.get(pk=delivery.task_id)
    event = TransitionEvent.objects.get(task_id=delivery.task_id, state_version=delivery.state_version)
    context_id = (
        A2AMessage.objects.filter(task_id=task.id).order_by("id").values_list("context_id", flat=True).first()
    ) or str(task.id)
    try:
        ssrf.screen(config.url)  # again at send time: the name may resolve elsewhere today
    except ssrf.UrlRefused as refused:
        return Outcome(False, None, f"refused: {refused}", final=True)
    body = body_of(status_update(task, event, context_id))
    token = secret(config, "token")
    headers = {
        "Content-Type": "application/json",
        TOKEN_HEADER: token,
        IDEMPOTENCY_HEADER: delivery.idempotency_id,
        SIGNATURE_HEADER: signature(body, token),
    }
    credentials = secret(config, "credentials")
    if config.auth_scheme and credentials:
        headers["Authorization"] = f"{config.auth_scheme} {credentials}"
    try:
        response = http.client().post(
            config.url,
            content=body,
            headers=headers,
            timeout=settings.A2A_PUSH_TIMEOUT,
            follow_redirects=False,  # a redirect could point anywhere the screen would refuse
        )
    except httpx.HTTPError as error:
        return Outcome(False, None, f"{type(error).__name__}: {error}"[:ERROR_SHOWN])
    if 200 <= response.status_code < 300:
        return Outcome(True, response.status_code, "")
    return Outcome(False, response.status_code, response.text[:ERROR_SHOWN])


def _record(delivery: PushDelivery, outcome: Outcome) -> None:
    now = timezone.now()
    attempts = delivery.attempts + 1
    changes: dict[str, Any] = {
        "attempts": attempts,
        "last_status": outcome.status,
        "last_error": outcome.error,
    }
    if outcome.delivered:
        changes.update(status=PushDelivery.Status.DELIVERED, delivered_at=now)
    elif outcome.final or attempts >= settings.A2A_PUSH_MAX_ATTEMPTS:
        changes.update(status=PushDelivery.Status.FAILED)
        log.warning("push delivery failed", extra={"delivery": delivery.idempotency_id, "attempts": attempts})
    else:
        changes.update(next_attempt_at=now + backoff(attempts))
    PushDelivery.objects.filter(pk=delivery.pk, status=PushDelivery.Status.PENDING).update(**changes)


def deliver_due(limit: int = 100) -> int:
    """Enqueue new status changes, then send what is due (module docstring); how many were sent
    successfully. Rounds go on while something is due, a config's versions one per round, in order."""
    enqueue()
    delivered = sent = 0
    while sent < limit:
        batch = _claim(limit - sent, timezone.now())
        if not batch:
            break
        for delivery in batch:
            outcome = _send(delivery)
            _record(delivery, outcome)
            delivered += outcome.delivered
        sent += len(batch)
    return delivered
