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
   POST (a plain-http URL to the very address screened: ``pinned``), and record the outcome. A 2xx
   is delivered; anything else is retried after ``min(cap, base * 2**(attempts-1))`` seconds plus
   up to 50 % jitter, and after ``A2A_PUSH_MAX_ATTEMPTS`` marked failed (the ``runtime.alerts`` scan
   then raises ``push_receiver_failing``).
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

A config without a token gets neither the token nor the signature header (an HMAC keyed with nothing
proves nothing). ``configure`` is how a caller's config is made (the A2A methods, ``SendMessage``'s
``configuration``): every field checked (``ConfigRefused`` names the one at fault), at most
``MAX_CONFIGS_PER_TASK`` live configs per task, the same id again replaces the config (or keeps it,
when nothing changed: a retried request acts once).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import re
import time
import uuid
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from a2a.types import a2a_pb2
from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, Exists, F, OuterRef, PositiveIntegerField, QuerySet, Value, When
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


MAX_CONFIGS_PER_TASK = 10  # live ones: a caller cannot make one status change a thousand POSTs
MAX_CONFIG_ID = 200
MAX_TOKEN = 1024
MAX_CREDENTIALS = 4096
# An HTTP token (RFC 9110): the scheme goes into the Authorization header as it is.
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]{0,63}")
# Visible ASCII (and spaces inside): header values, so no CR/LF can split a header.
HEADER_VALUE = re.compile(r"[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?")


class ConfigRefused(ValueError):
    """A push config we will not keep; ``field`` is the A2A field at fault (``url``, ``token``…)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_config(*, config_id: str, url: str, token: str, auth_scheme: str, credentials: str) -> None:
    """``ConfigRefused`` naming the first field a config may not have; the URL is screened (SSRF)."""
    if not config_id or len(config_id) > MAX_CONFIG_ID or not HEADER_VALUE.fullmatch(config_id):
        raise ConfigRefused("id", f"id must be 1 to {MAX_CONFIG_ID} visible ASCII characters")
    try:
        ssrf.screen(url)
    except ssrf.UrlRefused as refused:
        raise ConfigRefused("url", f"url refused ({refused.reason}): {refused}") from None
    if token and (len(token) > MAX_TOKEN or not HEADER_VALUE.fullmatch(token)):
        raise ConfigRefused("token", f"token must be at most {MAX_TOKEN} visible ASCII characters")
    if auth_scheme and not SCHEME.fullmatch(auth_scheme):
        raise ConfigRefused("authentication.scheme", "authentication.scheme must be an HTTP auth scheme name")
    if credentials and (len(credentials) > MAX_CREDENTIALS or not HEADER_VALUE.fullmatch(credentials)):
        raise ConfigRefused(
            "authentication.credentials",
            f"authentication.credentials must be at most {MAX_CREDENTIALS} visible ASCII characters",
        )
    if bool(auth_scheme) != bool(credentials):
        raise ConfigRefused("authentication", "authentication needs both scheme and credentials")


def fields_of(config: a2a_pb2.TaskPushNotificationConfig, task_id: str) -> dict[str, str]:
    """An A2A ``TaskPushNotificationConfig`` as ``configure``'s fields (no id: the task's id)."""
    return {
        "config_id": config.id or task_id,
        "url": config.url,
        "token": config.token,
        "auth_scheme": config.authentication.scheme,
        "credentials": config.authentication.credentials,
    }


def live_configs(task: Task) -> QuerySet[PushConfig]:
    return PushConfig.objects.filter(task=task, deleted_at__isnull=True).order_by("config_id")


def configure(
    task: Task,
    *,
    config_id: str,
    url: str,
    token: str = "",
    auth_scheme: str = "",
    credentials: str = "",
    created_by: Any = None,
) -> PushConfig:
    """The caller's config ``config_id`` for ``task`` (module docstring); ``ConfigRefused``.

    Two callers creating configs at once may pass the cap together by one each: the cap bounds
    abuse, it is not an invariant anything relies on."""
    check_config(config_id=config_id, url=url, token=token, auth_scheme=auth_scheme, credentials=credentials)
    try:
        with transaction.atomic():
            same = live_configs(task).filter(config_id=config_id).select_for_update().first()
            if same is not None:
                unchanged = (same.url, same.auth_scheme, secret(same, "token"), secret(same, "credentials"))
                if unchanged == (url, auth_scheme, token, credentials):
                    return same
                PushConfig.objects.filter(pk=same.pk).update(deleted_at=timezone.now())
            elif live_configs(task).count() >= MAX_CONFIGS_PER_TASK:
                raise ConfigRefused(
                    "taskId", f"the task has {MAX_CONFIGS_PER_TASK} push configs already: delete one first"
                )
            return _create(task, config_id, url, token, auth_scheme, credentials, created_by)
    except IntegrityError:  # the same id created at this very moment by another request
        raise ConfigRefused("id", "a config with this id was created at the same moment: read it") from None


def delete_config(task: Task, config_id: str) -> bool:
    """End the live config ``config_id`` (its deliveries are kept, none new is sent); False when the
    task never had a config of that id (deleting one deleted before is done already: True)."""
    ended = live_configs(task).filter(config_id=config_id).update(deleted_at=timezone.now())
    return bool(ended) or PushConfig.objects.filter(task=task, config_id=config_id).exists()


def masked_token(token: str) -> str:
    """What we show of a token: never all of it; its last four characters when it is long enough
    (16+) that they give nothing away, so its owner can tell which one it is."""
    if not token:
        return ""
    return "****" + token[-4:] if len(token) >= 16 else "****"


def _create(
    task: Task, config_id: str, url: str, token: str, auth_scheme: str, credentials: str, created_by: Any
) -> PushConfig:
    """The new config's row, its secrets sealed. The first delivery is the task's current status (the
    cursor starts one version back), so a receiver learns where the task stands before the next change."""
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


def status_update(task_id: Any, event: TransitionEvent, context_id: str) -> a2a_pb2.StreamResponse:
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
        task_id=str(task_id),
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
    """Write the deliveries of every status change past each live config's cursor; how many new.

    A fixed number of statements however many configs are behind (the sender runs this every few
    tenths of a second under load): the configs behind, their tasks' transitions past the lowest
    cursor, then one transaction that inserts every new delivery and moves every cursor forward."""
    now = now or timezone.now()
    behind = list(
        PushConfig.objects.filter(deleted_at__isnull=True, task__state_version__gt=F("cursor")).values_list(
            "id", "task_id", "cursor"
        )
    )
    if not behind:
        return 0
    changes: dict[Any, list[tuple[int, datetime]]] = {}
    for task_id, version, changed_at in (
        TransitionEvent.objects.filter(
            task_id__in={task_id for _, task_id, _ in behind},
            state_version__gt=min(cursor for _, _, cursor in behind),
        )
        .order_by("state_version")
        .values_list("task_id", "state_version", "created_at")
    ):
        changes.setdefault(task_id, []).append((version, changed_at))
    rows: list[PushDelivery] = []
    moved: dict[Any, int] = {}
    for config_id, task_id, cursor in behind:
        new = [(version, at) for version, at in changes.get(task_id, []) if version > cursor]
        if not new:
            continue
        moved[config_id] = new[-1][0]
        rows += [
            PushDelivery(
                config_id=config_id,
                task_id=task_id,
                state_version=version,
                idempotency_id=idempotency_id(task_id, version),
                next_attempt_at=now,
                changed_at=changed_at,
                created_at=now,
            )
            for version, changed_at in new
        ]
    if not rows:
        return 0
    with transaction.atomic():
        written = len(PushDelivery.objects.bulk_create(rows, ignore_conflicts=True))
        # Only forward: two enqueuers racing never move a cursor back. A crash before this commit
        # writes nothing; the rows written again later are dropped by the (config, version) constraint.
        PushConfig.objects.filter(pk__in=list(moved)).update(
            cursor=Case(
                *(
                    When(pk=config_id, cursor__lt=version, then=Value(version))
                    for config_id, version in moved.items()
                ),
                default=F("cursor"),
                output_field=PositiveIntegerField(),
            )
        )
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


def pinned(screened: ssrf.Screened) -> tuple[str, dict[str, str]]:
    """(URL, extra headers) that send to the address the screen judged, not to a second lookup of the
    name, which a hostile DNS server could answer with 127.0.0.1 (rebinding): for plain http, the
    URL's host becomes that address and ``Host`` keeps the name. An https URL keeps its name: the
    receiver must then show a certificate for it, which an internal service reached by rebinding
    cannot. An allow-listed host is the operator's, sent to as it is."""
    if screened.scheme != "http" or screened.allow_listed or not screened.addresses:
        return screened.url, {}
    address = screened.addresses[0]
    parts = urlsplit(screened.url)
    literal = f"[{address}]" if ":" in address else address
    url = urlunsplit(("http", f"{literal}:{screened.port}", parts.path, parts.query, ""))
    return url, {"Host": parts.netloc}


@dataclass(frozen=True)
class Outcome:
    delivered: bool
    status: int | None
    error: str
    final: bool = False  # no retry can help (the URL is refused now)


@dataclass(frozen=True)
class Ready:
    """A claimed delivery with everything its POST needs, read for a whole batch at once (``prepare``):
    sending it (``post``) touches no database, so any thread may."""

    delivery: PushDelivery
    url: str
    body: bytes
    token: str
    authorization: str


def prepare(batch: list[PushDelivery]) -> list[Ready]:
    """The batch's configs, transitions and context ids in three queries (not three per delivery)."""
    if not batch:
        return []
    configs = PushConfig.objects.in_bulk([row.config_id for row in batch])
    wanted = {(row.task_id, row.state_version) for row in batch}
    events = {
        (event.task_id, event.state_version): event
        for event in TransitionEvent.objects.filter(
            task_id__in={task for task, _ in wanted}, state_version__in={version for _, version in wanted}
        ).only("task_id", "state_version", "to_state", "reason_code", "created_at")
        if (event.task_id, event.state_version) in wanted
    }
    contexts: dict[Any, str] = {}
    for task_id, context_id in (
        A2AMessage.objects.filter(task_id__in={task for task, _ in wanted})
        .order_by("-id")
        .values_list("task_id", "context_id")
    ):
        contexts[task_id] = context_id  # newest first: the first message's wins
    ready = []
    for row in batch:
        config, event = configs[row.config_id], events[(row.task_id, row.state_version)]
        context_id = contexts.get(row.task_id) or str(row.task_id)
        credentials = secret(config, "credentials")
        authorization = f"{config.auth_scheme} {credentials}" if config.auth_scheme and credentials else ""
        ready.append(
            Ready(
                delivery=row,
                url=config.url,
                body=body_of(status_update(row.task_id, event, context_id)),
                token=secret(config, "token"),
                authorization=authorization,
            )
        )
    return ready


def post(ready: Ready) -> Outcome:
    """Screen the URL again (the name may resolve elsewhere today) and POST to the address screened."""
    try:
        screened = ssrf.screen(ready.url)
    except ssrf.UrlRefused as refused:
        return Outcome(False, None, f"refused: {refused}", final=True)
    url, host = pinned(screened)
    headers = {"Content-Type": "application/json", IDEMPOTENCY_HEADER: ready.delivery.idempotency_id, **host}
    if ready.token:
        headers.update({TOKEN_HEADER: ready.token, SIGNATURE_HEADER: signature(ready.body, ready.token)})
    if ready.authorization:
        headers["Authorization"] = ready.authorization
    try:
        response = http.client().post(
            url,
            content=ready.body,
            headers=headers,
            timeout=settings.A2A_PUSH_TIMEOUT,
            follow_redirects=False,  # a redirect could point anywhere the screen would refuse
        )
    except httpx.HTTPError as error:
        return Outcome(False, None, f"{type(error).__name__}: {error}"[:ERROR_SHOWN])
    if 200 <= response.status_code < 300:
        return Outcome(True, response.status_code, "")
    return Outcome(False, response.status_code, response.text[:ERROR_SHOWN])


def record(outcomes: list[tuple[PushDelivery, Outcome]]) -> int:
    """Write the outcomes of sent deliveries, in one transaction (the delivered ones, the usual case, in
    one statement per receiver status); how many were delivered."""
    now = timezone.now()
    pending = PushDelivery.objects.filter(status=PushDelivery.Status.PENDING)
    delivered: dict[int | None, list[int]] = {}
    with transaction.atomic():
        for delivery, outcome in outcomes:
            if outcome.delivered:
                delivered.setdefault(outcome.status, []).append(delivery.pk)
                continue
            attempts = delivery.attempts + 1
            changes: dict[str, Any] = {
                "attempts": attempts,
                "last_status": outcome.status,
                "last_error": outcome.error,
            }
            if outcome.final or attempts >= settings.A2A_PUSH_MAX_ATTEMPTS:
                changes.update(status=PushDelivery.Status.FAILED)
                log.warning(
                    "push delivery failed", extra={"delivery": delivery.idempotency_id, "attempts": attempts}
                )
            else:
                changes.update(next_attempt_at=now + backoff(attempts))
            pending.filter(pk=delivery.pk).update(**changes)
        for status, keys in delivered.items():
            pending.filter(pk__in=keys).update(
                status=PushDelivery.Status.DELIVERED,
                delivered_at=now,
                attempts=F("attempts") + 1,  # the row is leased to this sender: as read, plus this one
                last_status=status,
                last_error="",
            )
    return sum(len(keys) for keys in delivered.values())


PARALLEL = 8  # POSTs in flight at once per sender, each to another config


class Pipeline:
    """Sends in parallel, each config's deliveries in version order, a slow receiver holding only its slot.

    ``step`` enqueues the status changes committed since the last step, claims up to the free slots
    (``_claim`` gives one delivery per config, its first pending one; the claimed row stays pending
    until recorded, so the config's next version waits for it, in this process or any other), reads
    what the POSTs need in three queries, and hands each POST to a thread; ``collect`` records those
    that finished, in one transaction. A receiver that takes its whole ``A2A_PUSH_TIMEOUT`` holds one
    of ``PARALLEL`` slots meanwhile, never the others. Killed at any point: a claimed row's lease
    (three timeouts) runs out and another sender sends it again (at least once).
    """

    def __init__(self, parallel: int = PARALLEL, *, enqueue_every: float = 0.0) -> None:
        self.parallel = parallel
        self.enqueue_every = enqueue_every  # seconds between enqueues, however often ``step`` runs
        self.enqueued_at = float("-inf")
        self.pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="push-post")
        self.in_flight: dict[Future[Outcome], PushDelivery] = {}

    def step(self, *, limit: int | None = None) -> int:
        """Enqueue (at most every ``enqueue_every`` seconds) and start sending what is due; how many
        POSTs started."""
        if time.monotonic() - self.enqueued_at >= self.enqueue_every:
            enqueue()
            self.enqueued_at = time.monotonic()
        free = self.parallel - len(self.in_flight)
        if limit is not None:
            free = min(free, limit)
        if free <= 0:
            return 0
        ready = prepare(_claim(free, timezone.now()))
        for one in ready:
            self.in_flight[self.pool.submit(post, one)] = one.delivery
        return len(ready)

    def collect(self, timeout: float | None = 0) -> int:
        """Record the POSTs that finished within ``timeout`` seconds (None: all); how many delivered."""
        if not self.in_flight:
            return 0
        until = ALL_COMPLETED if timeout is None else FIRST_COMPLETED
        done, _ = wait(list(self.in_flight), timeout=timeout, return_when=until)
        outcomes = [(self.in_flight.pop(future), _outcome(future)) for future in done]
        return record(outcomes)

    def busy(self) -> bool:
        return bool(self.in_flight)

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _outcome(future: Future[Outcome]) -> Outcome:
    try:
        return future.result()
    except Exception as error:  # a bug in building the request: retried like a receiver's failure
        log.exception("push post failed")
        return Outcome(False, None, f"{type(error).__name__}: {error}"[:ERROR_SHOWN])


def deliver_due(limit: int = 100) -> int:
    """Enqueue new status changes, then send what is due, until nothing is or ``limit`` POSTs went out
    (module docstring; ``Pipeline``, each round waited for whole); how many were delivered. Rounds go
    on while something is due: a config's versions one per round, in order, configs in parallel."""
    pipeline = Pipeline()
    delivered = sent = 0
    try:
        while sent < limit:
            started = pipeline.step(limit=limit - sent)
            if not started:
                break
            sent += started
            delivered += pipeline.collect(timeout=None)
    finally:
        delivered += pipeline.collect(timeout=None)
        pipeline.close()
    return delivered
