"""Deciding approvals (``approvals.services``), the gate before the approved action runs, and expiry.

A refund of order A-1 owned by the operator is driven to ``waiting_approval``
against the sandbox over real HTTP; the worker is the in-process resume loop.
Every test that lets the task go on counts what the payment system performed.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals import services
from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.services import ApprovalRefused, Decided, approval_decide, expire_pending
from audit.models import TransitionEvent
from runtime import controls, engine, sweep
from runtime.llm import ScriptedModel
from tasks import registry
from tasks import services as task_services
from tasks.models import Policy, Task
from tasks.states import State
from tenancy.models import Membership, Role
from tenancy.services import grant_role
from tests.approvals.conftest import effects, fresh, in_threads, pending_request, run, triggers
from tests.conftest import make_user
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)
REFUND = registry.get("refund_request")


def decide(request: ApprovalRequest, user, decision: str = "approve", **overrides) -> Decided:
    fields = {"decision": decision, "digest_seen": request.digest, "comment": ""}
    fields.update(overrides)
    return approval_decide(request, user=fresh(user), **fields)


def refused(request: ApprovalRequest, user, decision: str = "approve", **overrides) -> ApprovalRefused:
    with pytest.raises(ApprovalRefused) as caught:
        decide(request, user, decision, **overrides)
    return caught.value


def nothing_decided(task: Task, request: ApprovalRequest) -> bool:
    """The request still pending, no decision row, the task still waiting at the same version."""
    request.refresh_from_db()
    current = Task.objects.get(pk=task.pk)
    return (
        request.status == ApprovalStatus.PENDING
        and not ApprovalDecision.objects.filter(request=request).exists()
        and (current.state, current.state_version) == (State.WAITING_APPROVAL, task.state_version)
    )


# --- asking ---------------------------------------------------------------------------------------


def test_the_request_binds_the_refund_as_it_stood_and_the_operator_as_requester(waiting):
    request = pending_request(waiting)
    assert request.opened("consequential")["effect"] == {  # the card is stored sealed to the request
        "kind": "refund",
        "order_id": "A-1",
        "amount": "10.00",
        "currency": "USD",
        "card": "visa-4242",
    }
    assert (request.step, request.action_step) == ("approve", "pay_refund")
    assert request.requested_by == "user:acme-operator"
    assert request.waiting_version == waiting.state_version
    assert request.material["order_total"] == "100.00" and request.evidence[0]["record_id"] == "A-1"
    assert waiting.wait_deadline == request.expires_at > timezone.now()


# --- deciding -------------------------------------------------------------------------------------


def test_an_approval_moves_the_task_to_resume_validation(waiting, approver):
    decided = decide(pending_request(waiting), approver, comment="looks right")
    assert decided.applied is True
    assert (decided.task.state, decided.task.state_version) == (
        State.RESUME_VALIDATION,
        waiting.state_version + 1,
    )
    assert decided.request.status == ApprovalStatus.APPROVED and decided.request.decided_at is not None


def test_an_approved_refund_runs_through_its_dispatch_steps_to_completed(waiting, approver):
    decide(pending_request(waiting), approver)
    task = run(waiting)
    assert task.state == State.COMPLETED
    [payment] = effects("payments")
    assert payment.request["card"] == "visa-4242" and payment.request["amount"] == "10.00"
    assert len(effects("tickets")) == 1 and len(effects("email")) == 1
    assert task.outcome["payment_ref"] == str(payment.pk)


def test_the_decision_is_recorded_once_with_who_decided_and_the_digest_they_saw(waiting, approver):
    request = pending_request(waiting)
    decide(request, approver, comment="checked the order")
    decision = ApprovalDecision.objects.get(request=request)
    assert decision.decided_by == approver and decision.decision == "approve"
    assert decision.digest_seen == request.digest and decision.comment == "checked the order"


def test_the_decision_is_an_audited_transition_by_the_approver(waiting, approver):
    decide(pending_request(waiting), approver)
    event = TransitionEvent.objects.get(task=waiting, trigger="approval_decided")
    assert (event.from_state, event.to_state) == (State.WAITING_APPROVAL, State.RESUME_VALIDATION)
    assert (event.actor_kind, event.actor_id) == ("approver", "user:acme-approver")
    assert event.reason_code == "approval_approved"


def test_the_same_decision_repeated_by_the_same_approver_applies_nothing_again(waiting, approver):
    request = pending_request(waiting)
    first = decide(request, approver)
    again = decide(ApprovalRequest.objects.get(pk=request.pk), approver)
    assert (first.applied, again.applied) == (True, False)
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert triggers(waiting).count("approval_decided") == 1
    assert Task.objects.get(pk=waiting.pk).state_version == waiting.state_version + 1


def test_a_late_approval_by_a_second_approver_reports_it_was_already_approved(waiting, approver, acme):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    decide(request, approver)
    late = decide(request, second)  # the stale, still-"pending" instance the second approver opened
    assert late.applied is False and late.request.status == ApprovalStatus.APPROVED
    assert ApprovalDecision.objects.get(request=request).decided_by == approver


def test_a_late_contrary_decision_is_refused_with_the_current_state(waiting, approver, acme):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    decide(request, approver)
    refusal = refused(request, second, "reject")
    assert (refusal.status, refusal.code) == (409, "already_decided")
    assert refusal.request.status == ApprovalStatus.APPROVED


def racing_advance(monkeypatch, parties: int = 2) -> None:
    """Hold every decider at the transition until all have passed their checks: a true race."""
    barrier = threading.Barrier(parties, timeout=15)
    real = services.advance

    def advance(*args, **kwargs):
        barrier.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(services, "advance", advance)


def deciding(request_id, user, decision: str):
    def call() -> Decided:
        request = ApprovalRequest.objects.get(pk=request_id)
        return approval_decide(request, user=fresh(user), decision=decision, digest_seen=request.digest)

    return call


def test_two_approvers_approving_at_once_commit_exactly_one_decision(waiting, approver, acme, monkeypatch):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    racing_advance(monkeypatch)
    results = in_threads(deciding(request.pk, approver, "approve"), deciding(request.pk, second, "approve"))
    assert all(isinstance(r, Decided) for r in results), results
    assert sorted(r.applied for r in results) == [False, True]
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert triggers(waiting).count("approval_decided") == 1
    assert Task.objects.get(pk=waiting.pk).state_version == waiting.state_version + 1


def test_two_approvers_deciding_differently_at_once_refuse_the_loser_with_409(
    waiting, approver, acme, monkeypatch
):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    racing_advance(monkeypatch)
    results = in_threads(deciding(request.pk, approver, "approve"), deciding(request.pk, second, "reject"))
    [won] = [r for r in results if isinstance(r, Decided)]
    [lost] = [r for r in results if isinstance(r, ApprovalRefused)]
    assert won.applied is True
    assert (lost.status, lost.code) == (409, "already_decided")
    made = ApprovalDecision.objects.get(request=request)
    assert made.decision == ("approve" if won.request.status == ApprovalStatus.APPROVED else "reject")
    assert lost.request.status == won.request.status
    assert triggers(waiting).count("approval_decided") == 1


def test_an_expired_request_cannot_be_approved(waiting, approver):
    request = pending_request(waiting)
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    refusal = refused(ApprovalRequest.objects.get(pk=request.pk), approver)
    assert (refusal.status, refusal.code) == (410, "expired")
    assert nothing_decided(waiting, request)


def test_a_decision_on_another_digest_than_the_request_is_refused(waiting, approver):
    request = pending_request(waiting)
    refusal = refused(request, approver, digest_seen="0" * 64)
    assert (refusal.status, refusal.code) == (409, "digest_mismatch")
    assert nothing_decided(waiting, request)


def test_the_requester_cannot_approve_their_own_request_even_as_an_approver(waiting, operator, acme):
    grant_role(operator, acme, Role.APPROVER)
    request = pending_request(waiting)
    refusal = refused(request, operator)
    assert (refusal.status, refusal.code) == (403, "self_approval")
    assert nothing_decided(waiting, request)


def test_a_member_without_the_approver_role_cannot_decide(waiting, auditor):
    request = pending_request(waiting)
    refusal = refused(request, auditor)
    assert (refusal.status, refusal.code) == (403, "not_an_approver")
    assert nothing_decided(waiting, request)


def test_an_approver_without_the_object_permission_cannot_decide(waiting, acme):
    # The role's membership row, but not the tenant's approver group the permission was granted to.
    stray = make_user("acme-stray-approver")
    Membership.objects.create(user=stray, tenant=acme, role=Role.APPROVER)
    request = pending_request(waiting)
    refusal = refused(request, stray)
    assert (refusal.status, refusal.code) == (403, "no_permission")
    assert nothing_decided(waiting, request)


def test_a_decision_for_a_task_that_no_longer_waits_is_refused(waiting, approver, admin_user):
    controls.task_control(
        waiting,
        "cancel",
        user=admin_user,
        roles=frozenset({"admin"}),
        expected_version=waiting.state_version,
        reason="customer withdrew",
    )
    refusal = refused(pending_request(waiting), approver)
    assert (refusal.status, refusal.code) == (409, "not_waiting")
    assert not ApprovalDecision.objects.exists()


def test_a_rejected_refund_fails_without_paying(waiting, approver):
    decided = decide(pending_request(waiting), approver, "reject", comment="not covered")
    assert decided.applied and decided.request.status == ApprovalStatus.REJECTED
    assert decided.task.state == State.RESUME_VALIDATION
    task = run(waiting)
    assert (task.state, task.state_reason) == (State.FAILED, "refund_rejected_by_approver")
    assert task.outcome == {"reason": "refund_rejected_by_approver"}
    assert effects("payments") == [] and effects("tickets") == []


# --- the gate before the approved action runs -----------------------------------------------------


def test_a_card_changed_after_approval_pays_nothing_and_asks_again(waiting, approver):
    old = pending_request(waiting)
    decide(old, approver)
    put_order("A-1", card="mastercard-1111")  # the worker has not resumed yet
    task = run(waiting)
    assert task.state == State.WAITING_APPROVAL
    assert effects("payments") == [] and effects("tickets") == []
    old.refresh_from_db()
    new = pending_request(task)
    assert old.status == ApprovalStatus.APPROVED and new.pk != old.pk
    assert new.opened("consequential")["effect"]["card"] == "mastercard-1111" and new.digest != old.digest
    assert new.waiting_version == task.state_version
    reasked = TransitionEvent.objects.filter(task=task, trigger="request_approval").latest("state_version")
    assert "the action changed since it was approved" in reasked.reason


def test_the_changed_card_is_paid_only_once_the_new_request_is_approved(waiting, approver, acme):
    decide(pending_request(waiting), approver)
    put_order("A-1", card="mastercard-1111")
    task = run(waiting)
    # Who approved the earlier request for this action may not decide the new one (issue 20):
    # another approver does.
    assert refused(pending_request(task), approver).code == "decided_before"
    decide(pending_request(task), make_user("acme-approver2", acme, Role.APPROVER))
    task = run(task)
    assert task.state == State.COMPLETED
    [payment] = effects("payments")
    assert payment.request["card"] == "mastercard-1111"


def test_a_policy_change_during_the_wait_replans_and_asks_again(waiting, approver):
    old = pending_request(waiting)
    Policy.objects.update_or_create(task_type="refund_request", defaults={"version": "2027-01"})
    decide(old, approver)
    task = run(waiting)
    replan = TransitionEvent.objects.get(task=task, trigger="replan")
    assert replan.reason_code == "policy_changed"
    assert task.state == State.WAITING_APPROVAL and task.policy_version == "2027-01"
    new = pending_request(task)
    assert new.pk != old.pk and new.policy_version == "2027-01"
    assert new.material["policy_version"] == "2027-01"
    old.refresh_from_db()
    assert old.status == ApprovalStatus.APPROVED
    assert effects("payments") == []


def test_a_changed_order_total_voids_the_approval(waiting, approver):
    old = pending_request(waiting)
    decide(old, approver)
    put_order("A-1", total="90.00")  # still covers the refund: triage says refund again
    task = run(waiting)
    assert task.state == State.WAITING_APPROVAL and pending_request(task).pk != old.pk
    assert pending_request(task).material["order_total"] == "90.00"
    assert effects("payments") == []


def test_evidence_reread_with_the_same_facts_proceeds_under_the_approval(waiting, approver):
    request = pending_request(waiting)
    decide(request, approver)
    put_order("A-1")  # same data, new record version: resume validation refreshes
    task = run(waiting)
    assert "refresh" in triggers(task)
    assert task.state == State.COMPLETED and len(effects("payments")) == 1
    assert ApprovalRequest.objects.filter(task=task).count() == 1


def test_a_changed_triage_is_immaterial_to_the_approval(waiting, approver):
    decide(pending_request(waiting), approver)
    put_order("A-1")  # force a refresh, so triage runs again
    task = run(waiting, model=ScriptedModel({"refund-triage@1": lambda facts: "refund (rechecked)"}))
    assert task_services.latest_checkpoint(task).facts["triage"] == "refund (rechecked)"
    assert task.state == State.COMPLETED and len(effects("payments")) == 1
    assert ApprovalRequest.objects.filter(task=task).count() == 1


def test_a_changed_status_read_afresh_after_the_decision_proceeds(waiting, approver):
    decide(pending_request(waiting), approver)
    put_order("A-1", status="in_transit")  # total unchanged; status needs fresh evidence, and gets it
    task = run(waiting, model=ScriptedModel({"refund-triage@1": lambda facts: "refund"}))
    assert task_services.latest_checkpoint(task).facts["order_status"] == "in_transit"
    assert task.state == State.COMPLETED and len(effects("payments")) == 1
    assert ApprovalRequest.objects.filter(task=task).count() == 1


def test_a_changed_status_without_fresh_evidence_asks_for_a_refresh(waiting, approver):
    request = decide(pending_request(waiting), approver).request
    progress = task_services.latest_checkpoint(waiting).progress
    stale = progress.model_copy(update={"facts": {**progress.facts, "order_status": "in_transit"}})
    verdict, why = services.gate(Task.objects.get(pk=waiting.pk), REFUND, request, stale)
    assert verdict == "refresh" and "order_status" in why


def test_the_payment_step_itself_refuses_to_send_under_an_approval_that_no_longer_matches(waiting, approver):
    decide(pending_request(waiting), approver)
    task = Task.objects.get(pk=waiting.pk)
    progress = task_services.latest_checkpoint(task).progress
    moved = progress.model_copy(update={"facts": {**progress.facts, "refund_card": "mastercard-1111"}})
    decision = engine._dispatch(task, REFUND, REFUND.step("pay_refund"), moved, dict(moved.facts), None)
    assert decision.reason_code == "approval_reapprove" and decision.progress.step == "approve"
    assert decision.actions == ()


# --- expiry ---------------------------------------------------------------------------------------


def test_expire_pending_marks_only_past_due_requests_expired(waiting):
    request = pending_request(waiting)
    assert expire_pending(now=request.expires_at - timedelta(seconds=1)) == 0
    assert expire_pending(now=request.expires_at + timedelta(seconds=1)) == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.EXPIRED


def test_a_request_already_marked_expired_cannot_be_approved(waiting, approver):
    request = pending_request(waiting)
    expire_pending(now=request.expires_at + timedelta(seconds=1))
    refusal = refused(request, approver)
    assert refusal.status in (409, 410) and refusal.request.status == ApprovalStatus.EXPIRED
    assert not ApprovalDecision.objects.exists()


def test_the_wait_for_approval_expires_the_task_through_the_sweep(waiting):
    report = sweep.sweep(lambda *args: None, now=waiting.wait_deadline + timedelta(seconds=1))
    task = Task.objects.get(pk=waiting.pk)
    assert report.expired == 1
    assert task.state == State.EXPIRED
    assert task.outcome == {"reason": "wait_expired", "waited_in": "waiting_approval"}
    assert triggers(task)[-1] == "wait_expired"
