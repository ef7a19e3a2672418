"""Approvals: asking, deciding, and checking an approval still holds before acting on it.

- ``request_decision`` — what the engine commits to ask: the request row,
  the wait, and the object permission for the tenant's approvers, in one
  transaction (so a task never waits for a request that does not exist).
- ``approval_decide`` — a person decides, with every authority check, as one
  optimistic transition of the task.
- ``gate`` — before the approved action runs: recompute the digest from the
  current action and compare the material facts with those approved.
- ``retarget_on_escalation`` — an escalation of a task waiting for approval
  hands the pending request on to the role escalated to, instead of voiding it,
  and bars the escalator from deciding it.

Who may not decide a request (separation of duties across the task's lineage)
is one rule, ``approvals.authority``: the request records that set when raised.

A request keeps the task type's sensitive values (the effect's sensitive keys,
sensitive material facts) sealed to itself (``audit.sealing``), and approvers
see them masked. The digest they approve is still taken over the clear values,
so it binds exactly what will be sent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError
from django.db.models import F
from django.utils import timezone
from guardian.shortcuts import assign_perm, remove_perm
from opentelemetry import trace

from approvals import authority
from approvals.digest import digest
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus, Decision
from audit import sealing
from ledger import integrity, money
from tasks import doorbell, metrics, registry
from tasks import services as task_services
from tasks.checkpoints import ApprovalRef, Progress
from tasks.decisions import Decision as StepDecision
from tasks.exceptions import StaleVersion
from tasks.models import Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tenancy.selectors import has_role
from tenancy.services import role_group

DECIDE = "approvals.decide_approvalrequest"
tracer = trace.get_tracer(__name__)


class ApprovalRefused(Exception):
    """A decision that cannot be taken; ``status`` is the HTTP answer that fits."""

    def __init__(self, message: str, *, code: str, status: int, request: ApprovalRequest | None = None):
        super().__init__(message)
        self.code, self.status, self.request = code, status, request


def consequential_fields(step: registry.Dispatch, facts: dict[str, Any]) -> dict[str, Any]:
    """What an approval of ``step`` authorizes: where the effect goes and exactly what it is."""
    fields = {"step": step.name, "connector": step.connector, "effect": step.effect(facts)}
    return {**fields, "binds": dict(step.binds)} if step.binds else fields


def material_snapshot(task: Task, kind: registry.TaskType, facts: dict[str, Any]) -> dict[str, Any]:
    return {**{name: facts.get(name) for name in kind.material_facts}, "policy_version": task.policy_version}


def _sealed(
    request: ApprovalRequest, kind: registry.TaskType, action: registry.Dispatch, material: dict[str, Any]
) -> None:
    """Seal ``request``'s copies of sensitive values to it: the effect's sensitive keys, sensitive facts."""
    at = sealing.approval_place(request.id, "consequential")
    fields = request.consequential
    request.consequential = {
        **fields,
        "effect": sealing.seal_fields(fields["effect"], action.sensitive, (*at, "effect")),
    }
    request.material = sealing.seal_fields(
        material, kind.sensitive, sealing.approval_place(request.id, "material")
    )


def request_decision(
    task: Task,
    kind: registry.TaskType,
    step: registry.RequestApproval,
    progress: Progress,
    *,
    now: datetime,
    why: str = "",
) -> StepDecision:
    """Ask for approval: enter ``waiting_approval`` with the request committed in the same transaction."""
    action = kind.step_as(step.action_step, registry.Dispatch)
    facts = dict(progress.facts)
    fields = consequential_fields(action, facts)
    # Why this needs an approval, shown on the approval card: the step's policy, and everything the
    # action's money policy found (a limit, a running total, an earlier effect for the same reference).
    review = money_review(task, action, facts)
    shown = [*review.reasons, *review.notes] if review is not None else []
    policy_reason = " ".join(part for part in [step.reason, *(f"{line}." for line in shown)] if part)
    material = material_snapshot(task, kind, facts)
    request = ApprovalRequest(
        task=task,
        tenant_id=task.tenant_id,
        step=step.name,
        action_step=action.name,
        waiting_version=task.state_version + 1,
        consequential=fields,
        digest=digest(fields),  # of the clear values: the approval binds what will be sent
        material=material,
        evidence=[ref.model_dump(mode="json") for ref in progress.evidence],
        policy_reason=policy_reason,
        policy_version=task.policy_version,
        approver_role=step.approver_role,
        requested_by=authority.actor_id(task.owner) if task.owner is not None else f"task:{task.id}",
        barred=authority.causes(task, action.name),  # who caused it to be asked: none of them decides it
        allowed_decisions=[Decision.APPROVE, Decision.REJECT],
        expires_at=now + step.timeout,
        created_at=now,
    )
    _sealed(request, kind, action, material)  # its id is set already (uuid7 default)
    approvers = role_group(task.tenant, step.approver_role)

    def grant_decide() -> None:
        assign_perm(DECIDE, approvers, request)

    waiting = progress.model_copy(
        update={
            "step": step.name,
            "approvals": [
                *progress.approvals,
                ApprovalRef(request_id=str(request.id), digest=request.digest, status=ApprovalStatus.PENDING),
            ],
        }
    )
    return StepDecision(
        State.WAITING_APPROVAL,
        Trigger.REQUEST_APPROVAL,
        waiting,
        reason=why or policy_reason,
        reason_code="approval_requested",
        changes={"wait_deadline": request.expires_at},
        records=(request,),
        also=(grant_decide,),
    )


def money_review(task: Task, action: registry.Dispatch, facts: dict[str, Any]) -> money.Review | None:
    """What ``action``'s money policy finds about its effect from ``facts`` for ``task`` (None: the
    action declares no policy). The engine asks before committing an intent; ``request_decision``
    shows the same findings on the request."""
    if action.money is None:
        return None
    return money.review(action.money, facts, money.spender(task, action.name), now=timezone.now())


@dataclass(frozen=True)
class EarlierEffect:
    """An effect of another task for the same business reference, as a request page lists it."""

    task_id: Any
    description: str  # ``ledger.money.describe``: amount, when, by which task, how it stands


def earlier_effects(request: ApprovalRequest, facts: dict[str, Any] | None) -> list[EarlierEffect]:
    """The effects for the business reference of ``request``'s action made before it was asked
    (the ones its policy reason names), for the request page to link; [] when the action declares
    no reference or the task's facts (``standing(request).facts``) could not be read. One read."""
    try:
        action = registry.get(request.task.task_type).step_as(request.action_step, registry.Dispatch)
    except (KeyError, LookupError):  # a retired type or step: nothing to list
        return []
    reference = action.money.reference_of(facts) if action.money is not None and facts is not None else ""
    if not reference:
        return []
    found = money.earlier_movements(request.tenant_id, request.task_id, reference, request.action_step)
    return [
        EarlierEffect(m.action.task_id, money.describe(m))
        for m in found
        if m.created_at <= request.created_at
    ]


def latest_request(task: Task, step_name: str) -> ApprovalRequest | None:
    return ApprovalRequest.objects.filter(task=task, step=step_name).order_by("-created_at").first()


def unrecorded_decision(request: ApprovalRequest, progress: Progress) -> str:
    """Why ``request``'s status is not what ``progress`` (the task's checkpoint, whose digest its
    keyed audit event records) says of it; "" when they agree.

    The row's ``status`` is a column the app role writes; ``approval_decide`` records the decision in
    the checkpoint it commits with its event too, which that role cannot forge. A request the row
    calls approved and the checkpoint does not was decided outside the app: it authorizes nothing.
    """
    recorded = next((ref.status for ref in progress.approvals if ref.request_id == str(request.id)), None)
    if recorded == request.status:
        return ""
    return (
        f"approval request {request.id} says {request.status}, but the task's chained checkpoint records "
        f"it {recorded or 'not at all'}: decided outside the app, it authorizes nothing"
    )


def gate(
    task: Task, kind: registry.TaskType, request: ApprovalRequest, progress: Progress
) -> tuple[str, str]:
    """Does an approval still cover the action as it stands now?

    Returns ``("proceed", "")``, ``("reapprove", why)`` — the action or an
    invalidating fact changed, or the policy did — or ``("refresh", why)`` — a
    fact that needs fresh evidence changed and no evidence was read since the
    decision; ``(EFFECT_DIGEST_MISMATCH, why)`` when the request's own copy of
    what it authorizes (the one approvers were shown) is not what its digest
    binds, or when its status is not the one the task's chained checkpoint
    records for it (``unrecorded_decision``): changed in the database, so the
    decision cannot stand for anything.
    """
    if why := unrecorded_decision(request, progress):
        return integrity.EFFECT_DIGEST_MISMATCH, why
    facts = dict(progress.facts)
    current = material_snapshot(task, kind, facts)
    try:
        approved = request.opened("material")
        shown = request.opened("consequential")
    except sealing.Unopenable as exc:  # its key retired: what was approved cannot be compared
        return "reapprove", f"the approved facts cannot be read ({exc.where}: {exc.problem})"
    if digest(shown) != request.digest:
        return integrity.EFFECT_DIGEST_MISMATCH, (
            f"approval request {request.id}: its copy of what it authorizes differs from its digest "
            f"{request.digest[:12]}… (changed after it was asked): the decision covers nothing"
        )
    rules = {**kind.material_facts, "policy_version": "invalidate"}
    stale = []
    for name, rule in rules.items():
        before, now = approved.get(name), current.get(name)
        if before == now or rule == "immaterial":
            continue
        # The reason goes to the audit log: a sensitive fact is named there masked.
        show: Callable[[Any], object] = sealing.mask if name in kind.sensitive else repr
        change = f"{show(before)} -> {show(now)}"
        if rule == "invalidate":
            return "reapprove", f"{name} changed since the approval: {change}"
        stale.append(f"{name}: {change}")
    fields = consequential_fields(kind.step_as(request.action_step, registry.Dispatch), facts)
    if digest(fields) != request.digest:
        return "reapprove", "the action changed since it was approved"
    fresh = request.decided_at and any(ref.fetched_at > request.decided_at for ref in progress.evidence)
    if stale and not fresh:
        return "refresh", "needs fresh evidence: " + ", ".join(stale)
    return "proceed", ""


@dataclass(frozen=True)
class Decided:
    request: ApprovalRequest
    task: Task
    applied: bool  # False: this decision had already been taken; nothing was applied again
    note: str = ""


def _may_decide(user: Any, request: ApprovalRequest) -> None:
    if not has_role(user, request.tenant_id, request.approver_role):
        raise ApprovalRefused(
            f"Deciding needs the {request.approver_role} role in this tenant.",
            code="not_an_approver",
            status=403,
            request=request,
        )
    if not user.has_perm(DECIDE, request):
        raise ApprovalRefused(
            "You have no permission to decide this request.",
            code="no_permission",
            status=403,
            request=request,
        )
    refused = authority.refusal(user, request)
    if refused is not None:
        code, message = refused
        raise ApprovalRefused(message, code=code, status=403, request=request)


def _already(request: ApprovalRequest, decision: str) -> Decided:
    """A decision for a request that is no longer pending: the same one is acknowledged, another refused."""
    made = ApprovalDecision.objects.filter(request=request).first()
    if made is not None and made.decision == decision:
        return Decided(request, request.task, applied=False, note=f"already {request.status}")
    raise ApprovalRefused(
        f"This request was already {request.status}.", code="already_decided", status=409, request=request
    )


def approval_decide(
    request: ApprovalRequest, *, user: Any, decision: str, digest_seen: str, comment: str = ""
) -> Decided:
    """Decide a pending, unexpired request whose digest the approver saw.

    Refuses (``ApprovalRefused``): 403 without the role or the object permission
    (``not_an_approver``, ``no_permission``), or when the request names the user as
    one who caused it (``approvals.authority``: ``self_approval`` for its requester,
    ``decided_before``, ``caused_this_request``); 400 for a decision not allowed; 410
    once expired; 409 when already decided otherwise, when the digest differs
    (the request changed since it was shown), when the task no longer waits
    for this request, or when its type no longer has the request's step
    (``step_removed``: a tool removed from an agent since it asked). The same
    decision repeated is acknowledged with ``applied=False``.

    One span, ``approval.decide``: the request, the decision and what came of it
    (``applied``, ``acknowledged`` or the refusal's code); never the comment.
    """
    with tracer.start_as_current_span("approval.decide") as span:
        try:
            decided = _decide(request, user=user, decision=decision, digest_seen=digest_seen, comment=comment)
        except ApprovalRefused as exc:
            _describe(span, request, decision, exc.code)
            raise
        _describe(span, request, decision, "applied" if decided.applied else "acknowledged")
        return decided


def _describe(span: trace.Span, request: ApprovalRequest, decision: str, outcome: str) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "durable.task.id": str(request.task_id),
                "durable.approval.request_id": str(request.pk),
                "durable.approval.step": request.step,
                "durable.approval.decision": decision,
                "durable.approval.outcome": outcome,
            }
        )


def _decide(request: ApprovalRequest, *, user: Any, decision: str, digest_seen: str, comment: str) -> Decided:
    _may_decide(user, request)
    if decision not in request.allowed_decisions:
        raise ApprovalRefused(
            f"{decision!r} is not one of {request.allowed_decisions}.",
            code="bad_decision",
            status=400,
            request=request,
        )
    now = timezone.now()
    if request.status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED, ApprovalStatus.INVALIDATED):
        return _already(request, decision)
    if request.status == ApprovalStatus.EXPIRED or now >= request.expires_at:
        raise ApprovalRefused(
            f"This request expired at {request.expires_at:%Y-%m-%d %H:%M} UTC.",
            code="expired",
            status=410,
            request=request,
        )
    if digest_seen != request.digest:
        raise ApprovalRefused(
            "What you saw is not what this request authorizes (digest differs): reload it.",
            code="digest_mismatch",
            status=409,
            request=request,
        )
    task = request.task
    if (task.state, task.state_version) != (State.WAITING_APPROVAL, request.waiting_version):
        raise ApprovalRefused(
            f"The task no longer waits for this request (it is {task.state}).",
            code="not_waiting",
            status=409,
            request=request,
        )
    try:
        step = registry.get(task.task_type).step_as(request.step, registry.RequestApproval)
    except LookupError:  # a deployment since the request dropped its step (an agent's removed tool)
        raise ApprovalRefused(
            f"The task's type no longer has the step this request is for ({request.step}): nothing was"
            " decided, and nothing of it will be sent; an operator decides what the task does.",
            code="step_removed",
            status=409,
            request=request,
        ) from None
    status = ApprovalStatus.APPROVED if decision == Decision.APPROVE else ApprovalStatus.REJECTED
    point = task_services.latest_checkpoint(task)
    approvals = [
        ref if ref.request_id != str(request.id) else ref.model_copy(update={"status": status})
        for ref in point.approvals
    ]
    progress = point.progress.model_copy(
        update={
            "step": step.next if status == ApprovalStatus.APPROVED else step.on_rejected,
            "approvals": approvals,
        }
    )
    row = ApprovalDecision(
        request=request,
        decision=decision,
        decided_by=user,
        digest_seen=digest_seen,
        comment=comment,
        decided_at=now,
    )

    def settle_request() -> None:
        if not ApprovalRequest.objects.filter(pk=request.pk, status=ApprovalStatus.PENDING).update(
            status=status, decided_at=now
        ):
            raise StaleVersion("the request was decided meanwhile")

    try:
        task = advance(
            task.id,
            request.waiting_version,
            State.RESUME_VALIDATION,
            actor=Actor.user(user, ActorKind.APPROVER),
            trigger=Trigger.APPROVAL_DECIDED,
            reason=comment or status.value,  # "approved" / "rejected" (it once read "rejectd")
            reason_code=f"approval_{status}",
            progress=progress,
            records=[row],
            also=[settle_request],
        )
    except (StaleVersion, IntegrityError):
        # Someone decided first (or the task moved): report what holds now, apply nothing.
        request.refresh_from_db()
        if request.status == ApprovalStatus.PENDING:
            raise ApprovalRefused(
                "The task moved on while you decided; reload it.",
                code="not_waiting",
                status=409,
                request=request,
            ) from None
        return _already(request, decision)
    metrics.approval_decided(status, request.created_at, now)  # durable_approval_decision_latency_seconds
    doorbell.ring(task.id, task.region)
    request.refresh_from_db()
    return Decided(request, task, applied=True)


# Roles that may decide an approval. An escalation to another role (an operator) keeps the
# request with the role it had: an operator who could route a payment's approval to operators
# would make the money policy one operator token again.
DECIDING_ROLES = (Role.APPROVER, Role.ADMIN)


@dataclass(frozen=True)
class Retarget:
    """The pending request a task waits for, handed on by an escalation of that task.

    The escalation is a self-loop that bumps the task's version; without this the
    request would no longer match the wait (``waiting_version``) and be invalidated.
    The request keeps its digest, consequential fields and facts: only who decides
    it and the version it answers change.
    """

    request: ApprovalRequest
    role: str  # who decides it from now on
    by: str = ""  # the escalator's actor id: barred from deciding it ("" for a sweep's escalation)

    @property
    def note(self) -> str:
        """What the escalation's audit event says happened to the request."""
        before = self.request.approver_role
        barred = f"; {self.by} may not decide it" if self.by else ""
        if self.role == before:
            return f"approval request {self.request.id} stays with the {before} role{barred}"
        return (
            f"approval request {self.request.id} re-targeted from the {before} role to the {self.role} role"
            f"{barred}"
        )

    def apply(self, waiting_version: int) -> None:
        """Inside the escalation's transaction: move the request to the new wait and role, and
        name the escalator among those who may not decide it (never to the escalator).

        Raises ``StaleVersion`` when the request was decided or settled meanwhile
        (the whole escalation then commits nothing).
        """
        request = self.request
        barred = authority.with_cause(request, self.by, authority.Cause.ESCALATED)
        moved = ApprovalRequest.objects.filter(
            pk=request.pk, status=ApprovalStatus.PENDING, waiting_version=request.waiting_version
        ).update(waiting_version=waiting_version, approver_role=self.role, barred=barred)
        if moved != 1:
            raise StaleVersion("the approval request was decided or settled while the task was escalated")
        if self.role != request.approver_role:
            task = request.task
            remove_perm(DECIDE, role_group(task.tenant, request.approver_role), request)
            assign_perm(DECIDE, role_group(task.tenant, self.role), request)


def retarget_on_escalation(task: Task, *, escalate_to: str, by: Actor | None = None) -> Retarget | None:
    """The pending request ``task`` waits for, to be decided by ``escalate_to`` after an escalation
    by ``by`` (a person is then barred from deciding it; a sweep is not a person).

    None when the task waits for no pending request. ``escalate_to`` outside
    ``DECIDING_ROLES`` leaves the request with the role it has.
    """
    if task.state != State.WAITING_APPROVAL:
        return None
    request = (
        ApprovalRequest.objects.select_related("task__tenant")
        .filter(task=task, status=ApprovalStatus.PENDING, waiting_version=task.state_version)
        .first()
    )
    if request is None:
        return None
    role = escalate_to if escalate_to in DECIDING_ROLES else request.approver_role
    escalator = by.id if by is not None and authority.is_person(by.kind) else ""
    return Retarget(request, role, by=escalator)


@dataclass(frozen=True)
class Standing:
    """A request against the task as it stands (its newest checkpoint, one read)."""

    changed: bool  # the action built from the current facts is not what was asked
    evidence_now: list[dict[str, Any]] | None  # the evidence the task holds now; None: unreadable
    facts: dict[str, Any] | None = None  # the task's facts now; None: unreadable


def standing(request: ApprovalRequest) -> Standing:
    """Has the action changed since ``request`` was made, and which evidence does the task hold now?"""
    try:
        progress = task_services.latest_checkpoint(request.task).progress
    except Exception:  # an unreadable checkpoint: certainly not what was asked
        return Standing(changed=True, evidence_now=None)
    evidence_now = [ref.model_dump(mode="json") for ref in progress.evidence]
    try:
        action = registry.get(request.task.task_type).step_as(request.action_step, registry.Dispatch)
        changed = digest(consequential_fields(action, dict(progress.facts))) != request.digest
        # The copy the page shows must be what the digest binds too (else changed in the database).
        changed = changed or digest(request.opened("consequential")) != request.digest
    except Exception:  # a vanished step, facts it cannot be built from, a copy that cannot be opened
        changed = True
    return Standing(changed=changed, evidence_now=evidence_now, facts=dict(progress.facts))


def changed_since_requested(request: ApprovalRequest) -> bool:
    """Would the action, built from the task's facts as they stand, differ from what was asked?"""
    return standing(request).changed


def expire_pending(*, now: datetime | None = None) -> int:
    """Settle requests nobody can decide any more; return how many.

    Past ``expires_at``: expired (their tasks' waits end through the sweep).
    Their task no longer waits for them (canceled, quarantined, expired, or a
    newer request): invalidated.
    """
    pending = ApprovalRequest.objects.filter(status=ApprovalStatus.PENDING)
    expired = pending.filter(expires_at__lte=now or timezone.now()).update(status=ApprovalStatus.EXPIRED)
    metrics.approvals_expired(expired)
    orphaned = pending.exclude(task__state=State.WAITING_APPROVAL, task__state_version=F("waiting_version"))
    return expired + orphaned.update(status=ApprovalStatus.INVALIDATED)
