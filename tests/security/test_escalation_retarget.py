"""Escalating a task that waits for approval hands its request on (issue 12, reproduction 8).

Before: the escalation, a self-loop that bumps the task's version, left the
pending request bound to the old version: deciding it answered 409
(``not_waiting``), the sweep marked it ``invalidated``, and nothing could be
decided until the wait's deadline. Now the same request — same digest, same
action — answers the new version and is decided by the role escalated to.
The task is a payment above the money threshold, run against the sandbox.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from approvals import services as approvals
from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from runtime import controls, runner
from tasks.exceptions import StaleVersion
from tasks.models import Task
from tasks.states import State
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


@pytest.fixture
def waiting(acme, operator) -> Task:
    """A payment of 5,000 owned by the operator, waiting for an approver."""
    invoice = {"invoice_id": "INV-5", "amount": "5000.00", "currency": "EUR"}
    task = run(make_task(acme, task_type="pay_invoice", objective="Pay INV-5", input=invoice, owner=operator))
    assert task.state == State.WAITING_APPROVAL
    return task


def post(user, path: str, body: Any):
    return api_client_for(user).post(path, json.dumps(body), content_type="application/json")


def escalate(user, task: Task, to: str):
    body = {"expected_version": task.state_version, "reason": "needs a senior look", "escalate_to": to}
    response = post(user, f"/api/tasks/{task.pk}/escalate/", body)
    assert response.status_code == 200, response.content
    return Task.objects.get(pk=task.pk)


def decide(user, request: ApprovalRequest, decision: str = "approve"):
    return post(
        user, f"/api/approvals/{request.pk}/decide/", {"decision": decision, "digest": request.digest}
    )


def inbox(user) -> list[str]:
    response = api_client_for(user).get("/api/approvals/", {"status": "pending"})
    return [row["id"] for row in response.json()["results"]]


def test_an_escalated_request_stays_pending_and_the_role_escalated_to_decides_it(
    waiting, operator, approver, admin_user
):
    before = ApprovalRequest.objects.get(task=waiting)
    task = escalate(operator, waiting, "admin")
    assert approvals.expire_pending() == 0  # the sweep's pass that used to invalidate it
    request = ApprovalRequest.objects.get(pk=before.pk)
    assert request.status == ApprovalStatus.PENDING
    assert (request.approver_role, request.waiting_version) == ("admin", task.state_version)
    assert (request.digest, request.consequential) == (before.digest, before.consequential)
    response = decide(admin_user, request)
    assert response.status_code == 200, response.content
    assert response.json()["applied"] is True
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED
    assert Effect.objects.filter(system="payments").count() == 1


def test_the_old_409_invalidated_is_gone_for_the_request_the_task_waits_for(waiting, operator, approver):
    """The reproduction: escalate, the sweep runs, the approver decides the request the page showed.

    Before: 409 ``already_decided`` with status ``invalidated`` (or ``not_waiting`` before the sweep).
    """
    shown = ApprovalRequest.objects.get(task=waiting)
    escalate(operator, waiting, "approver")
    approvals.expire_pending()
    response = decide(approver, shown)
    assert response.status_code == 200, response.json()
    assert (response.json()["applied"], response.json()["request"]["status"]) == (True, "approved")


def test_the_new_roles_inbox_shows_the_request_and_the_old_ones_no_longer_does(
    waiting, operator, approver, admin_user
):
    request = ApprovalRequest.objects.get(task=waiting)
    assert inbox(approver) == [str(request.pk)] and inbox(admin_user) == []
    escalate(operator, waiting, "admin")
    assert inbox(admin_user) == [str(request.pk)]
    assert inbox(approver) == []
    response = decide(approver, request)
    assert (response.status_code, response.json()["code"]) == (403, "not_an_approver")


def test_the_escalation_event_records_the_hand_over(waiting, operator):
    request = ApprovalRequest.objects.get(task=waiting)
    task = escalate(operator, waiting, "admin")
    event = TransitionEvent.objects.get(task=task, state_version=task.state_version)
    assert event.trigger == "escalate"
    assert (
        f"approval request {request.pk} re-targeted from the approver role to the admin role" in event.reason
    )
    assert task.escalation_reason == "needs a senior look"


def test_an_escalation_to_operators_keeps_the_request_with_its_approvers(waiting, operator, approver):
    """Operators never decide approvals: else an operator could route a payment's approval to operators."""
    request = ApprovalRequest.objects.get(task=waiting)
    task = escalate(operator, waiting, "operator")
    request.refresh_from_db()
    assert (request.status, request.approver_role) == ("pending", "approver")
    assert request.waiting_version == task.state_version
    assert (
        "stays with the approver role"
        in TransitionEvent.objects.get(task=task, state_version=task.state_version).reason
    )
    assert decide(operator, request).status_code == 403
    assert decide(approver, request).status_code == 200


def test_a_second_escalation_hands_the_request_on_again(waiting, operator, approver, admin_user):
    request = ApprovalRequest.objects.get(task=waiting)
    task = escalate(operator, waiting, "admin")
    task = escalate(operator, task, "approver")
    request.refresh_from_db()
    assert (request.approver_role, request.waiting_version, request.status) == (
        "approver",
        task.state_version,
        "pending",
    )
    assert decide(admin_user, request).status_code == 403
    assert decide(approver, request, "reject").status_code == 200
    assert run(Task.objects.get(pk=task.pk)).state == State.FAILED
    assert not Effect.objects.filter(system="payments").exists()


def test_an_escalation_after_the_decision_is_refused_as_stale_and_changes_nothing(
    waiting, operator, approver
):
    request = ApprovalRequest.objects.get(task=waiting)
    assert decide(approver, request).status_code == 200
    body = {"expected_version": waiting.state_version, "reason": "too late", "escalate_to": "admin"}
    response = post(operator, f"/api/tasks/{waiting.pk}/escalate/", body)
    assert (response.status_code, response.json()["code"]) == (409, "stale_version")
    request.refresh_from_db()
    assert (request.status, request.approver_role) == ("approved", "approver")


def test_a_request_settled_while_the_escalation_commits_rolls_the_escalation_back(
    waiting, operator, monkeypatch
):
    """The hand-over runs inside the escalation's transaction: a request no longer pending aborts both."""
    found = approvals.retarget_on_escalation

    def settled_meanwhile(task: Task, **options: Any) -> approvals.Retarget | None:
        retarget = found(task, **options)
        ApprovalRequest.objects.filter(task=task).update(status=ApprovalStatus.EXPIRED)
        return retarget

    monkeypatch.setattr(approvals, "retarget_on_escalation", settled_meanwhile)
    with pytest.raises(StaleVersion):
        controls.task_control(
            waiting,
            "escalate",
            user=operator,
            roles=frozenset({"operator"}),
            expected_version=waiting.state_version,
            reason="race",
            escalate_to="admin",
        )
    task = Task.objects.get(pk=waiting.pk)
    assert (task.state_version, task.escalation_level) == (waiting.state_version, 0)
    assert ApprovalRequest.objects.get(task=task).approver_role == "approver"
