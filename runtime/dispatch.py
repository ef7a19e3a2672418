"""Sending an intended effect, once per claim, and recording what came back.

1. Claim: one guarded UPDATE moves the action ``intended``/``reconciled_absent``
   -> ``dispatching``, only while the worker's lease is still live with its
   fencing token and the task still at the lease's ownership epoch
   (``tasks.leases.fence``). A second claimer, a worker whose task was taken
   over while it was paused, or one whose region lost the task in a failover,
   changes nothing.
   Before the claim, the effect as it will be sent (its sealed values opened) is
   checked against every record of what was intended (``_not_as_intended``):
   the row's ``effect_digest``, the approval's digest for an approved action
   (and the keyed ``approval_decided`` event that approved it), and the digest
   the keyed audit chain binds (the intent's checkpoint, whose
   digest the intending transition's event records). A difference — someone
   changed the row in the database — sends nothing: the action is withheld
   (``intended`` -> ``failed``, outcome ``withheld``; a ``reconciled_absent``
   one stays so, for the late-landing check) and ``EffectMismatch`` tells the
   engine to quarantine the task with ``effect_digest_mismatch``.
   An SDK agent's call bound to evidence (``registry.EvidenceBinding``) is checked once more
   against the facts of the checkpoint the keyed chain vouches for as its intent's: the record
   its arguments name must be the one the task read, the amount within its total, the currency
   its own. One that is not is withheld the same way (``ArgumentUnbound``: the task quarantined
   with ``agent_argument_unbound``): the step refused it already, so only a path around that
   check — a bug, an intent written by other means — gets here, and it moves no money.
2. Check, then send: right before the request leaves, the worker checks its
   fence again and that it is still within ``SEND_WINDOW`` of its claim on
   its own clock; a worker that finds either gone sends nothing. The
   connector is called outside any transaction, with a timeout.
3. Record: ``succeeded`` / ``failed`` on a definite answer, ``unknown``
   otherwise — guarded by the claim's send count and the lease token, so an
   answer never settles a later send. An unknown action is never sent again
   until the reconciler has looked it up and found it absent.
A process that dies (or freezes) between 1 and 3 leaves the action
``dispatching``: in doubt, and settled by the reconciler exactly like ``unknown``.

Each claim-and-send is a span, ``action.dispatch``: the connector, a hash of the
idempotency key and the state the action ended in; never the effect.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery
from opentelemetry import trace

from approvals.digest import digest as approval_digest
from approvals.models import ApprovalRequest, ApprovalStatus
from audit import sealing
from audit.chain import HASHED_FIELDS, LEGACY, OPTIONAL_HASHED_FIELDS, link_hash
from audit.keys import chain_keys
from audit.models import TransitionEvent
from audit.redaction import redact
from ledger import connectors, integrity
from ledger.connectors.base import OutcomeUnknown, Rejected
from ledger.models import SENDABLE, Action, DispatchState
from ledger.services import action_move
from runtime import chaos, db
from tasks import cancellation, checkpoints, leases, metrics, registry
from tasks.exceptions import LeaseLost, StaleEpoch, StaleVersion
from tasks.leases import Held
from tasks.models import Checkpoint, Lease, Task
from tasks.states import Trigger

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
# The longest a worker may take from its claim to starting the send. The
# reconciler trusts "absent" only CONNECTOR_MAX_IN_FLIGHT after the claim, which
# must exceed this plus the connector's timeout plus the system's own latency.
SEND_WINDOW = 2.0
CANCELED_AFTER_CLAIM = "a cancel request came after the claim"


@dataclass(frozen=True)
class Claimed:
    """A send this worker may make: the row as claimed, and when (monotonic clock)."""

    action: Action
    lease: Held
    at: float
    effect: dict[str, Any]  # the effect as it is sent: its sealed values opened (``audit.sealing``)


class EffectMismatch(Exception):
    """The effect about to be sent is not the one intended (or approved): it was not sent.

    ``code``: the reason code the task's quarantine records."""

    code = integrity.EFFECT_DIGEST_MISMATCH


class ArgumentUnbound(EffectMismatch):
    """An agent's call about to be sent names arguments its task's evidence does not vouch for."""

    code = registry.ARGUMENT_UNBOUND


def _with_body(events: QuerySet[TransitionEvent]) -> QuerySet[TransitionEvent]:
    """``events``, each with the body of the checkpoint committed with it (``body``)."""
    body = Checkpoint.objects.filter(task_id=OuterRef("task_id"), state_version=OuterRef("state_version"))
    return events.annotate(body=Subquery(body.values("body")[:1]))


def _chained_bodies(events: QuerySet[TransitionEvent]) -> Iterator[dict[str, Any]]:
    """The checkpoint bodies (parsed) of those of ``events`` (``_with_body``) that the keyed chain
    vouches for: the event's link verifies under a chain key, which the app role does not hold,
    and its checkpoint is the one it records. An unkeyed (legacy) or unverified event vouches for
    nothing, so a row the app role inserted (it may insert events) is never trusted here."""
    keys = chain_keys()
    for event in events:
        body = getattr(event, "body", None)
        if event.key_id == LEGACY or event.key_id not in keys or not body:
            continue
        fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
        link = link_hash(event.prev_hash, fields, key_id=event.key_id, keys=keys)
        if not hmac.compare_digest(link.encode(), event.hash.encode()):
            continue
        if not event.checkpoint_digest or checkpoints.digest(body) != event.checkpoint_digest:
            continue
        yield json.loads(body)


def _chained_intent(action: Action) -> dict[str, Any] | None:
    """The checkpoint body (parsed) the keyed audit chain vouches for as ``action``'s intent; None
    when there is none.

    The transition that intended it wrote the action and its checkpoint (whose
    ``pending_actions`` name the key and digest) at the moment the action was
    created, and its event records that checkpoint's digest under the chain
    key. One read: the task's events at that moment (the unique (task, version)
    index) with their checkpoint's body.
    """
    events = TransitionEvent.objects.filter(task_id=action.task_id, created_at=action.created_at)
    for body in _chained_bodies(_with_body(events)):
        for pending in body.get("pending_actions") or ():
            if pending.get("idempotency_key") == action.idempotency_key:
                return body
    return None


def _chained_digest(action: Action, intent: dict[str, Any] | None) -> str | None:
    """The effect digest the keyed audit chain binds for ``action`` (``intent``: its
    ``_chained_intent``); None when nothing binds one."""
    for pending in (intent or {}).get("pending_actions") or ():
        if pending.get("idempotency_key") == action.idempotency_key:
            return str(pending.get("effect_digest"))
    return None


def _unbound(call: registry.Dispatch | None, intent: dict[str, Any] | None) -> str:
    """Why an agent's call bound to evidence (``registry.Dispatch.unbound``) must not be sent: its
    arguments and the evidence, as the chained checkpoint of its intent (``intent``) holds them (sealed
    facts opened), do not agree. "" for any other action (``call`` None: a workflow's own step), and
    for one they vouch for."""
    if call is None or call.unbound is None:
        return ""
    if intent is None:  # the intent's own check (``_not_as_intended``) refuses this first
        return "no checkpoint the audit chain vouches for holds its intent"
    try:
        facts = checkpoints.decode(json.dumps(intent)).facts
    except checkpoints.CheckpointUnreadable as exc:
        return f"the checkpoint of its intent cannot be read: {exc}"
    return call.unbound(facts)


def _unchained_approval(approval: ApprovalRequest) -> str:
    """Why the keyed audit chain does not vouch for ``approval`` being approved; "" when it does.

    ``approval_decide`` moves the task out of the wait it decided (``waiting_version``) with an
    ``approval_decided`` event whose checkpoint records the request approved. The request row's
    ``status`` is the app role's to write; that event is not. One read.
    """
    events = TransitionEvent.objects.filter(
        task_id=approval.task_id,
        state_version=approval.waiting_version + 1,
        trigger=Trigger.APPROVAL_DECIDED,
    )
    for body in _chained_bodies(_with_body(events)):
        for ref in body.get("approvals") or ():
            if ref.get("request_id") == str(approval.id) and ref.get("status") == ApprovalStatus.APPROVED:
                return ""
    return (
        f"approval request {approval.id} is approved by no keyed approval_decided event of the task "
        "(its status was set outside the app)"
    )


def _agent_call(action: Action, lease: Held) -> registry.Dispatch | None:
    """The ``Dispatch`` step of an agent's tool call ``action`` performs; None for a workflow's own
    step. The task's type is the claimed row's when the lease holds it, else one read."""
    if registry.CALL_MARK not in action.step:
        return None
    if lease.task is not None and lease.task.pk == action.task_id:
        task_type: str | None = lease.task.task_type
    else:
        task_type = Task.objects.filter(pk=action.task_id).values_list("task_type", flat=True).first()
    try:
        step = registry.get(task_type or "").step(action.step)
    except KeyError:
        return None
    return step if isinstance(step, registry.Dispatch) else None


def _not_as_intended(
    action: Action,
    effect: dict[str, Any],
    approval: ApprovalRequest | None,
    *,
    intent: dict[str, Any] | None,
    call: registry.Dispatch | None,
) -> str:
    """Why ``effect`` (``action``'s, opened) must not be sent as the intent; "" when every record agrees.

    Cheapest first: the row's digest, the approval's (both rows in hand), then the chained record
    (``intent``, read once by the caller). ``call``: the agent's call it performs (``_agent_call``).
    """
    actual = integrity.effect_digest(effect)
    why = integrity.mismatch(actual, action.effect_digest, "the action row's effect_digest")
    if not why and approval is not None:
        # What an approval authorizes (approvals.services.consequential_fields), built from this action.
        authorized = {"step": action.step, "connector": action.connector, "effect": effect}
        if call is not None and call.binds:  # an agent's tool call: the agent, tool and call are bound too
            authorized["binds"] = dict(call.binds)
        why = integrity.mismatch(approval_digest(authorized), approval.digest, "the approval's digest")
        why = why or _unchained_approval(approval)
    if not why:
        why = integrity.mismatch(
            actual, _chained_digest(action, intent), "the intent the audit chain records"
        )
    return why


def _withhold(action: Action, lease: Held, why: str, code: str = integrity.EFFECT_DIGEST_MISMATCH) -> None:
    """Never send ``action``: an intent never claimed becomes ``failed`` (withheld, definitely not
    performed); one found absent after an earlier send stays so, for the reconciler's late-landing check."""
    log.error("effect not as intended; not sent", extra={"action": action.idempotency_key, "why": why})
    if action.dispatch_state == DispatchState.INTENDED:
        action_move(
            action.pk,
            DispatchState.INTENDED,
            DispatchState.FAILED,
            attempts=action.attempts,
            fence=leases.fence(lease),
            last_error=f"{code}: {why}; never sent",
            outcome=integrity.withheld_outcome(),
        )


def _lost(lease: Held, why: str) -> LeaseLost:
    return LeaseLost(f"lease #{lease.token} on task {lease.task_id} is no longer held: {why}")


def claim(
    action_id: int, *, lease: Held, at_version: int | None = None, approval: ApprovalRequest | None = None
) -> Claimed | None:
    """Take a sendable action for the holder of ``lease``; None if it is not sendable (any more).

    ``approval``: the approved request the action runs under, if it needs one.
    Raises ``EffectMismatch``, having withheld the action unsent, when its
    effect is not what was intended or approved, and ``ArgumentUnbound`` when
    an agent's call is not what its evidence vouches for (module docstring, 1).

    Raises ``LeaseLost`` when the action is still sendable but the lease is
    not held, ``StaleEpoch`` when the task failed over to another region since
    the lease was claimed: the worker has lost its task and must stop. Given
    ``at_version`` (the task version the worker decided from), ``StaleVersion``
    when the task moved on since — a cancel request, say: nothing is sent after it.
    """
    action = Action.objects.get(pk=action_id)
    if action.dispatch_state not in SENDABLE:
        return None
    # Opened before the claim: an effect this process cannot open (its key retired) is never marked as
    # sent; the error (naming the field and key id, not the value) quarantines the task instead.
    effect = sealing.open_effect(action.idempotency_key, action.effect)
    intent, call = _chained_intent(action), _agent_call(action, lease)  # one read each, for both checks
    why = _not_as_intended(action, effect, approval, intent=intent, call=call)
    if why:
        _withhold(action, lease, why)
        raise EffectMismatch(why)
    unbound = _unbound(call, intent)
    if unbound:
        _withhold(action, lease, unbound, ArgumentUnbound.code)
        raise ArgumentUnbound(f"{action.step}: {unbound}")
    chaos.before_claim(action)
    moved = action_move(
        action.pk,
        action.dispatch_state,
        DispatchState.DISPATCHING,
        attempts=action.attempts,
        fence=leases.fence(lease, at_version=at_version) & ~cancellation.call_cancel_open(lease.task_id),
    )
    if not moved:
        unchanged = Action.objects.filter(
            pk=action.pk, dispatch_state=action.dispatch_state, attempts=action.attempts
        ).exists()
        if unchanged:
            owner = (
                Task.objects.filter(pk=lease.task_id)
                .values_list("ownership_epoch", "region", "state", "state_version")
                .first()
            )
            if owner is not None and owner[0] != lease.epoch:
                raise StaleEpoch(
                    f"task {lease.task_id} failed over to region {owner[1]!r} at epoch {owner[0]}:"
                    f" this worker's lease was claimed in {lease.region!r} at epoch {lease.epoch}: not sent"
                )
            if owner is not None and at_version is not None and owner[3] != at_version:
                raise StaleVersion(
                    f"task {lease.task_id} moved on to {owner[2]} v{owner[3]} since v{at_version}: not sent",
                    state=owner[2],
                    state_version=owner[3],
                )
            canceled = Task.objects.filter(cancellation.call_cancel_open(lease.task_id)).exists()
            if owner is not None and canceled:
                # Decided before a cancel request committed: void, like a stale version. The worker reads
                # the request on its next claim and withdraws the call instead (runtime.engine).
                raise StaleVersion(
                    f"a cancel request for task {lease.task_id} is open: not sent", state=owner[2],
                    state_version=owner[3],
                )  # fmt: skip
            raise _lost(lease, "cannot claim the send")
        return None
    return Claimed(Action.objects.get(pk=action_id), lease, time.monotonic(), effect)


def _may_still_send(claimed: Claimed) -> str:
    """Why this worker must not send now ("" when it may)."""
    if time.monotonic() - claimed.at > SEND_WINDOW:
        return f"more than {SEND_WINDOW}s passed since the claim"
    lease = claimed.lease
    # One query for every fence: the lease row still ours, its task's ownership epoch, no cancel since.
    found = (
        Lease.objects.filter(task_id=lease.task_id, token=lease.token, worker_id=lease.worker_id)
        .annotate(canceled=cancellation.call_cancel_open(lease.task_id))
        .values_list("task__ownership_epoch", "canceled")
        .first()
    )
    if found is None:
        return "the task was taken over"
    epoch, canceled = found
    if epoch != lease.epoch:
        return f"the task failed over to another region (now epoch {epoch}, the lease's {lease.epoch})"
    if canceled:
        return CANCELED_AFTER_CLAIM
    return ""


def send(claimed: Claimed) -> Action:
    """Call the connector for a claimed (``dispatching``) action and record the answer.

    Raises ``LeaseLost``, sending nothing, when the fence is gone or the send
    window has passed (the action stays ``dispatching``, for the reconciler).
    """
    action = claimed.action
    chaos.before_send(action)
    why_not = _may_still_send(claimed)
    if why_not:
        log.warning("not sending", extra={"action": action.idempotency_key, "why": why_not})
        if why_not == CANCELED_AFTER_CLAIM and action.attempts == 1:
            # Its first send, not made: definitely not performed, so the cancel need not wait for a
            # lookup. (A resend of an effect found absent stays in doubt: the first send may still land.)
            action_move(
                action.pk,
                DispatchState.DISPATCHING,
                DispatchState.FAILED,
                attempts=action.attempts,
                fence=leases.fence(claimed.lease, live=False),
                last_error=f"withdrawn: {why_not}; never sent",
            )
            raise StaleVersion(f"{action.idempotency_key} not sent: {why_not}")
        raise _lost(claimed.lease, why_not)
    connector = connectors.get(action.connector)
    target: DispatchState
    fields: dict[str, Any]
    try:
        with db.released():  # no database session held while the system answers
            outcome = connector.dispatch(action.idempotency_key, dict(claimed.effect))
        chaos.after_send(action)
    except Rejected as exc:
        error = redact(str(exc))  # kept in the ledger and shown on task pages
        target, fields = (
            DispatchState.FAILED,
            {"last_error": error[:2000], "outcome": {"status": "rejected", "detail": error[:500]}},
        )
    except OutcomeUnknown as exc:
        error = redact(str(exc))
        log.warning("outcome unknown", extra={"action": action.idempotency_key, "error": error})
        target, fields = DispatchState.UNKNOWN, {"last_error": error[:2000]}
    else:
        target = DispatchState.SUCCEEDED if outcome.status == "succeeded" else DispatchState.FAILED
        fields = {
            "external_ref": outcome.external_ref,
            "outcome": {"status": outcome.status, "record_version": outcome.record_version, **outcome.detail},
            "duplicates_suppressed": action.duplicates_suppressed + int(outcome.replayed),
        }
        metrics.duplicates_suppressed(action.connector, int(outcome.replayed))
    # Not live: an answer that took longer than the lease is still ours to record
    # as long as nobody claimed the task since (the token is unchanged).
    recorded = action_move(
        action.pk,
        DispatchState.DISPATCHING,
        target,
        attempts=action.attempts,
        fence=leases.fence(claimed.lease, live=False),
        **fields,
    )
    if not recorded:
        # Settled meanwhile by a reconciler that asked the system itself, or the
        # task changed hands: the record made by others stands.
        log.warning(
            "answer arrived after the action was settled or the task taken over",
            extra={"action": action.idempotency_key, "answer": target},
        )
    return Action.objects.get(pk=action.pk)


def claim_and_send(
    action_id: int, *, lease: Held, at_version: int | None = None, approval: ApprovalRequest | None = None
) -> Action:
    """Send the action if this worker can claim it; either way return its current row.

    Refuses as ``claim`` does (``EffectMismatch`` included).
    """
    with tracer.start_as_current_span("action.dispatch") as span:
        claimed = claim(action_id, lease=lease, at_version=at_version, approval=approval)
        action = send(claimed) if claimed is not None else Action.objects.get(pk=action_id)
        if span.is_recording():
            span.set_attributes({**action_attributes(action), "durable.action.sent": claimed is not None})
        return action


def action_attributes(action: Action) -> dict[str, Any]:
    """What a span may say about an action: which, where, how far. Not its effect, not its key
    (a hash of it: enough to match spans, nothing to replay)."""
    return {
        "durable.task.id": str(action.task_id),
        "durable.action.id": action.pk,
        "durable.action.step": action.step,
        "durable.action.connector": action.connector,
        "durable.action.key_hash": hashlib.sha256(action.idempotency_key.encode()).hexdigest()[:16],
        "durable.action.attempts": action.attempts,
        "durable.action.state": str(action.dispatch_state),
    }
