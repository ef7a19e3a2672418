"""The approvals API (``/api/approvals/``): deciding over HTTP, the approver inbox, and the request detail.

Every request goes through DRF's ``APIClient`` (``api_client_for``) on
PostgreSQL; the task behind each request is a refund driven to
``waiting_approval`` against the sandbox over real HTTP.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import ApprovalDecision, ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent
from runtime import controls
from tasks.models import Task
from tasks.states import State
from tenancy.models import Membership, Role
from tenancy.services import grant_role
from tests.approvals.conftest import (
    APPROVALS,
    decide_url,
    detail_url,
    drive_to_approval,
    effects,
    fresh,
    in_threads,
    pending_request,
    run,
    triggers,
)
from tests.conftest import api_client_for, make_user
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


# The approvals suites' two fixtures (tests/approvals/conftest.py), for this directory.
@pytest.fixture
def sandbox(live_server, settings):
    """Point the connectors and evidence reads at the sandbox; order A-1 exists, delivered."""
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")


@pytest.fixture
def waiting(sandbox, acme, operator) -> Task:
    """A refund of order A-1 owned by the operator, waiting for its approval."""
    return drive_to_approval(acme, operator)


def post(user, path: str, body: Any):
    return api_client_for(fresh(user)).post(path, json.dumps(body), content_type="application/json")


def get(user, path: str, **params):
    return api_client_for(fresh(user)).get(path, params)


def approve_body(request: ApprovalRequest, decision: str = "approve", **overrides) -> dict[str, Any]:
    return {"decision": decision, "digest": request.digest, "comment": "", **overrides}


def unchanged(task: Task, request: ApprovalRequest) -> bool:
    request.refresh_from_db()
    current = Task.objects.get(pk=task.pk)
    return (
        request.status == ApprovalStatus.PENDING
        and not ApprovalDecision.objects.filter(request=request).exists()
        and (current.state, current.state_version) == (State.WAITING_APPROVAL, task.state_version)
    )


def inbox_ids(user) -> list[str]:
    response = get(user, APPROVALS, status="pending")
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


# --- deciding -------------------------------------------------------------------------------------


def test_approving_answers_200_applied_and_moves_the_task_to_resume_validation(waiting, approver):
    request = pending_request(waiting)
    response = post(approver, decide_url(request), approve_body(request, comment="ok"))
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["applied"] is True
    assert body["request"]["status"] == "approved" and body["request"]["task_state"] == "resume_validation"
    assert body["request"]["decision"]["by"] == "acme-approver"
    assert Task.objects.get(pk=waiting.pk).state == State.RESUME_VALIDATION


def test_an_approval_over_http_leads_the_worker_to_pay_and_complete(waiting, approver):
    request = pending_request(waiting)
    post(approver, decide_url(request), approve_body(request))
    task = run(waiting)
    assert task.state == State.COMPLETED
    assert len(effects("payments")) == 1
    request.refresh_from_db()
    assert request.status == ApprovalStatus.APPROVED
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    event = TransitionEvent.objects.get(task=task, trigger="approval_decided")
    assert event.actor_id == "user:acme-approver"
    assert triggers(task)[-1] == "complete"


def test_repeating_the_same_decision_answers_200_not_applied(waiting, approver):
    request = pending_request(waiting)
    first = post(approver, decide_url(request), approve_body(request))
    again = post(approver, decide_url(request), approve_body(request))
    assert (first.status_code, again.status_code) == (200, 200)
    assert (first.json()["applied"], again.json()["applied"]) == (True, False)
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert triggers(waiting).count("approval_decided") == 1


def test_two_approvers_posting_at_once_get_one_applied_and_one_acknowledged(waiting, approver, acme):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    barrier = threading.Barrier(2, timeout=15)

    def posting(user):
        client = api_client_for(fresh(user))

        def call():
            barrier.wait()
            return client.post(decide_url(request), approve_body(request), format="json")

        return call

    responses = in_threads(posting(approver), posting(second))
    assert [r.status_code for r in responses] == [200, 200], responses
    assert sorted(r.json()["applied"] for r in responses) == [False, True]
    assert ApprovalDecision.objects.filter(request=request).count() == 1
    assert triggers(waiting).count("approval_decided") == 1


def test_a_contrary_decision_after_the_first_answers_409_with_the_current_state(waiting, approver, acme):
    second = make_user("acme-approver2", acme, Role.APPROVER)
    request = pending_request(waiting)
    post(approver, decide_url(request), approve_body(request))
    response = post(second, decide_url(request), approve_body(request, "reject"))
    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "already_decided" and body["status"] == "approved"
    assert body["task_state"] == "resume_validation" and body["state_version"] == waiting.state_version + 1


def test_approving_after_expiry_answers_410(waiting, approver):
    request = pending_request(waiting)
    ApprovalRequest.objects.filter(pk=request.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = post(approver, decide_url(request), approve_body(request))
    assert response.status_code == 410 and response.json()["code"] == "expired"
    assert unchanged(waiting, request)


def test_approving_another_digest_answers_409_digest_mismatch(waiting, approver):
    request = pending_request(waiting)
    response = post(approver, decide_url(request), approve_body(request, digest="ab" * 32))
    assert response.status_code == 409 and response.json()["code"] == "digest_mismatch"
    assert unchanged(waiting, request)


def test_the_requester_approving_their_own_request_answers_403(waiting, operator, acme):
    grant_role(operator, acme, Role.APPROVER)
    request = pending_request(waiting)
    response = post(operator, decide_url(request), approve_body(request))
    assert response.status_code == 403 and response.json()["code"] == "self_approval"
    assert unchanged(waiting, request)


def test_an_approver_of_another_tenant_gets_404(waiting, globex):
    foreign = make_user("globex-approver", globex, Role.APPROVER)
    request = pending_request(waiting)
    response = post(foreign, decide_url(request), approve_body(request))
    assert response.status_code == 404
    assert unchanged(waiting, request)


def test_an_auditor_deciding_answers_403(waiting, auditor):
    request = pending_request(waiting)
    response = post(auditor, decide_url(request), approve_body(request))
    assert response.status_code == 403 and response.json()["code"] == "not_an_approver"
    assert unchanged(waiting, request)


def test_an_approver_without_the_object_permission_answers_403(waiting, acme):
    stray = make_user("acme-stray-approver")
    Membership.objects.create(user=stray, tenant=acme, role=Role.APPROVER)  # no group, so no permission
    request = pending_request(waiting)
    response = post(stray, decide_url(request), approve_body(request))
    assert response.status_code == 403 and response.json()["code"] == "no_permission"
    assert unchanged(waiting, request)


def test_an_anonymous_decision_is_refused(waiting):
    request = pending_request(waiting)
    response = APIClient().post(decide_url(request), approve_body(request), format="json")
    assert response.status_code in (401, 403)
    assert unchanged(waiting, request)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"decision": "maybe"}, "decision"),
        ({"digest": "not-a-digest"}, "digest"),
        ({"digest": "AB" * 32}, "digest"),
        ({"digest": "ab" * 31}, "digest"),
        ({"comment": "nul \x00 byte"}, "comment"),
    ],
)
def test_a_malformed_decision_answers_400_with_the_field(waiting, approver, overrides, field):
    request = pending_request(waiting)
    response = post(approver, decide_url(request), approve_body(request, **overrides))
    assert response.status_code == 400
    assert field in response.json()
    assert unchanged(waiting, request)


def test_a_body_that_is_not_a_json_object_answers_400(waiting, approver):
    request = pending_request(waiting)
    client = api_client_for(fresh(approver))
    for raw in ("[]", '"approve"', "{", ""):
        response = client.post(decide_url(request), raw, content_type="application/json")
        assert response.status_code == 400, (raw, response.status_code)
    assert unchanged(waiting, request)


def test_rejecting_over_http_fails_the_task_without_paying(waiting, approver):
    request = pending_request(waiting)
    response = post(approver, decide_url(request), approve_body(request, "reject", comment="no"))
    assert response.status_code == 200 and response.json()["request"]["status"] == "rejected"
    task = run(waiting)
    assert (task.state, task.state_reason) == (State.FAILED, "refund_rejected_by_approver")
    assert effects("payments") == []


# --- the inbox and the detail ---------------------------------------------------------------------


def test_the_inbox_lists_the_tenants_pending_requests_oldest_first(sandbox, acme, operator, approver):
    first = drive_to_approval(acme, operator)
    second = drive_to_approval(acme, operator)
    expected = [str(pending_request(first).pk), str(pending_request(second).pk)]
    assert inbox_ids(approver) == expected


def test_the_inbox_shows_what_the_approver_authorizes(waiting, approver):
    [row] = get(approver, APPROVALS, status="pending").json()["results"]
    request = pending_request(waiting)
    assert row["digest"] == request.digest and row["consequential"] == request.shown_consequential
    assert row["consequential"]["effect"]["card"] == "•••• 4242"  # masked: stored sealed
    assert row["policy_reason"] and row["evidence"] and row["expires_at"] and row["live"] is True


def test_the_inbox_leaves_out_expired_requests(waiting, approver):
    ApprovalRequest.objects.filter(task=waiting).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert inbox_ids(approver) == []


def test_the_inbox_leaves_out_decided_requests(waiting, approver):
    request = pending_request(waiting)
    post(approver, decide_url(request), approve_body(request))
    assert inbox_ids(approver) == []


def test_the_inbox_never_shows_another_tenants_requests(sandbox, acme, globex, operator, outsider):
    drive_to_approval(acme, operator)
    foreign = make_user("globex-approver", globex, Role.APPROVER)
    assert inbox_ids(foreign) == []


def test_the_inbox_leaves_out_the_approvers_own_requests(sandbox, acme, operator):
    grant_role(operator, acme, Role.APPROVER)  # the operator also approves, just not their own
    own = drive_to_approval(acme, operator)
    colleague = drive_to_approval(acme, make_user("acme-operator2", acme, Role.OPERATOR))
    inbox = inbox_ids(operator)
    assert str(pending_request(own).pk) not in inbox
    assert inbox == [str(pending_request(colleague).pk)]


def test_an_auditor_has_an_empty_inbox(waiting, auditor):
    assert inbox_ids(auditor) == []


def test_the_detail_of_another_tenants_request_is_404(waiting, outsider, globex):
    request = pending_request(waiting)
    foreign = make_user("globex-approver", globex, Role.APPROVER)
    assert get(outsider, detail_url(request)).status_code == 404
    assert get(foreign, detail_url(request)).status_code == 404


def test_the_detail_shows_the_request_to_its_tenant(waiting, auditor):
    request = pending_request(waiting)
    response = get(auditor, detail_url(request))
    assert response.status_code == 200
    assert response.json()["id"] == str(request.pk) and response.json()["status"] == "pending"


def test_the_task_detail_lists_its_pending_approval(waiting, operator):
    request = pending_request(waiting)
    response = get(operator, f"/api/tasks/{waiting.pk}/")
    assert response.status_code == 200
    [pending] = response.json()["pending_approvals"]
    assert pending["id"] == str(request.pk) and pending["digest"] == request.digest
    assert (pending["step"], pending["action_step"]) == ("approve", "pay_refund")


def test_a_task_canceled_while_waiting_for_approval_lists_no_pending_approval(waiting, admin_user, operator):
    # The request can never be decided now (the task no longer waits for it), so it is not pending.
    controls.task_control(
        waiting,
        "cancel",
        user=admin_user,
        roles=frozenset({"admin"}),
        expected_version=waiting.state_version,
        reason="customer withdrew",
    )
    task = run(waiting)
    assert task.state == State.CANCELED
    assert get(operator, f"/api/tasks/{task.pk}/").json()["pending_approvals"] == []
