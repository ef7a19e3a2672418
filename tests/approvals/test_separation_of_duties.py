"""Separation of duties across the whole lineage (issue 20, item 1).

Before: a rerun kept the original owner as the requester and the check compared
only that, so a user holding operator and approver reran a 7,500 USD payment
another approver had rejected, approved the rerun himself, and it was paid; an
admin who is not an approver escalated a pending 6,000 USD approval to the admin
role and approved it himself. Now a request names everyone who caused it to be
asked for (``approvals.authority``) and none of them may decide it.

Each test is the attack over HTTP (DRF's ``APIClient`` and the console), on
PostgreSQL, with the payments sandbox served by ``live_server`` and counted
there, at the authoritative system.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from approvals.models import ApprovalRequest, ApprovalStatus
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from runtime import runner
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tenancy.models import Role
from tests.conftest import api_client_for, make_task, make_user
from tests.lifecycle.booking import GUARDED, booking_types, canceled_booking, sandbox

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["booking_types", "sandbox"]  # fixtures (the compensation test's task types and the sandbox)


@pytest.fixture(autouse=True)
def _world(sandbox):
    """The sandbox over live HTTP for every test here."""


@pytest.fixture
def both(acme):
    """One person holding operator and approver in the tenant (allowed: the rule is per request)."""
    return make_user("acme-both", acme, Role.OPERATOR, Role.APPROVER)


@pytest.fixture
def approver2(acme):
    return make_user("acme-approver2", acme, Role.APPROVER)


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def post(user, path: str, body: Any):
    return api_client_for(user).post(path, json.dumps(body), content_type="application/json")


def payment(tenant, owner, amount: str) -> Task:
    """A ``pay_invoice`` above the threshold, owned by ``owner``, waiting for an approver."""
    invoice = {"invoice_id": "INV-7", "amount": amount, "currency": "USD"}
    task = run(make_task(tenant, task_type="pay_invoice", objective="Pay INV-7", input=invoice, owner=owner))
    assert task.state == State.WAITING_APPROVAL, task.state
    return task


def pending(task: Task) -> ApprovalRequest:
    """The request ``task`` waits for now (a release leaves the one it waited for before behind)."""
    task = Task.objects.get(pk=task.pk)
    return ApprovalRequest.objects.get(
        task=task, status=ApprovalStatus.PENDING, waiting_version=task.state_version
    )


def decide(user, request: ApprovalRequest, decision: str = "approve", comment: str = ""):
    body = {"decision": decision, "digest": request.digest, "comment": comment}
    return post(user, f"/api/approvals/{request.pk}/decide/", body)


def control(user, task: Task, name: str, **extra):
    body = {"expected_version": task.state_version, "reason": f"{name} it", **extra}
    response = post(user, f"/api/tasks/{task.pk}/{name}/", body)
    assert response.status_code == 200, response.content
    return Task.objects.get(pk=task.pk)


def rerun(user, task: Task) -> Task:
    response = post(user, f"/api/tasks/{task.pk}/rerun/", {"reason": "the vendor called, pay it"})
    assert response.status_code == 201, response.content
    return run(Task.objects.get(pk=response.json()["id"]))


def inbox(user) -> list[str]:
    response = api_client_for(user).get("/api/approvals/", {"status": "pending"})
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def paid() -> int:
    return Effect.objects.filter(system="payments").count()


@pytest.fixture
def rejected_then_rerun(acme, operator, approver, both) -> Task:
    """The attack's set-up: the operator's 7,500 USD payment, rejected by the approver (the task
    fails), then rerun over the API by a user holding operator and approver; the rerun waits."""
    task = payment(acme, operator, "7500.00")
    response = decide(approver, pending(task), "reject", comment="not on the vendor list")
    assert response.status_code == 200, response.content
    assert run(Task.objects.get(pk=task.pk)).state == State.FAILED
    again = rerun(both, Task.objects.get(pk=task.pk))
    assert (again.state, again.rerun_of_id) == (State.WAITING_APPROVAL, task.pk)
    return again


def test_the_rerunner_cannot_approve_the_rerun_of_a_rejected_payment(rejected_then_rerun, both):
    response = decide(both, pending(rejected_then_rerun))
    assert response.status_code == 403, response.content
    body = response.json()
    assert body["code"] == "caused_this_request"
    assert "you reran this task" in body["detail"]
    assert Task.objects.get(pk=rejected_then_rerun.pk).state == State.WAITING_APPROVAL
    assert paid() == 0


def test_the_approver_who_rejected_cannot_approve_the_rerun(rejected_then_rerun, approver):
    response = decide(approver, pending(rejected_then_rerun))
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "decided_before"
    assert "you rejected an earlier request for this action" in response.json()["detail"]
    assert paid() == 0


def test_a_third_approver_can_override_the_rejection_and_it_is_paid_once(rejected_then_rerun, approver2):
    response = decide(approver2, pending(rejected_then_rerun))
    assert response.status_code == 200, response.content
    assert run(Task.objects.get(pk=rejected_then_rerun.pk)).state == State.COMPLETED
    assert paid() == 1


def test_the_api_detail_shows_the_earlier_rejection_and_who_may_not_decide(
    rejected_then_rerun, approver2, approver, both, operator
):
    request = pending(rejected_then_rerun)
    body = api_client_for(approver2).get(f"/api/approvals/{request.pk}/").json()
    [earlier] = body["earlier_decisions"]
    assert (earlier["decision"], earlier["by"], earlier["comment"]) == (
        "reject",
        approver.username,
        "not on the vendor list",
    )
    assert earlier["task"] == str(rejected_then_rerun.rerun_of_id) and earlier["at"]
    barred = {row["actor"]: row["why"] for row in body["may_not_decide"]}
    assert "reran this task" in barred[f"user:{both.username}"]
    assert "rejected an earlier request for this action" in barred[f"user:{approver.username}"]
    assert "asked for this action" in barred[f"user:{operator.username}"]


def test_the_console_request_page_shows_the_earlier_rejection_and_why_the_rerunner_may_not_decide(
    rejected_then_rerun, approver2, approver, both
):
    request = pending(rejected_then_rerun)
    console = Client()
    console.force_login(approver2)
    page = console.get(f"/console/approvals/{request.pk}/").content.decode()
    assert 'id="earlier-decisions"' in page
    assert "not on the vendor list" in page and approver.username in page
    assert "Approving this request overrides a rejection" in page
    assert 'name="decision" value="approve"' in page  # the third approver may decide
    console.force_login(both)
    page = console.get(f"/console/approvals/{request.pk}/").content.decode()
    assert 'name="decision" value="approve"' not in page
    assert "You may not decide this request: you reran this task" in page
    # And the console's decide refuses too, with its 403 page (never a 500).
    response = console.post(
        f"/console/approvals/{request.pk}/decide/",
        {"decision": "reject", "digest": request.digest, "comment": ""},
    )
    assert response.status_code == 403


def test_the_inbox_lists_the_rerun_only_to_who_may_decide_it(rejected_then_rerun, both, approver, approver2):
    request = str(pending(rejected_then_rerun).pk)
    assert request not in inbox(both)
    assert request not in inbox(approver)
    assert inbox(approver2) == [request]


def test_the_earlier_decider_is_refused_on_a_rerun_whoever_reran_it(acme, operator, approver, approver2):
    task = payment(acme, operator, "7500.00")
    assert decide(approver, pending(task), "reject").status_code == 200
    again = rerun(operator, run(Task.objects.get(pk=task.pk)))
    response = decide(approver, pending(again), "reject")  # rejecting again is deciding too
    assert (response.status_code, response.json()["code"]) == (403, "decided_before")
    assert decide(approver2, pending(again)).status_code == 200


def test_every_generation_of_reruns_counts_two_reruns_back(acme, operator, approver, approver2, both):
    task = payment(acme, operator, "7500.00")
    assert decide(approver, pending(task), "reject").status_code == 200
    first = rerun(operator, run(task))
    assert decide(approver2, pending(first), "reject").status_code == 200
    second = rerun(both, run(first))
    request = pending(second)
    codes = {user.username: decide(user, request).json().get("code") for user in (approver, approver2, both)}
    assert codes == {
        approver.username: "decided_before",
        approver2.username: "decided_before",
        both.username: "caused_this_request",
    }
    assert inbox(approver) == inbox(approver2) == inbox(both) == []
    third = make_user("acme-approver3", acme, Role.APPROVER)
    assert decide(third, request).status_code == 200
    assert run(second).state == State.COMPLETED and paid() == 1


def test_an_admin_who_escalates_a_payment_to_admins_cannot_approve_it(acme, operator, admin_user):
    task = payment(acme, operator, "6000.00")
    request = pending(task)
    control(admin_user, task, "escalate", escalate_to="admin")
    request.refresh_from_db()
    assert request.approver_role == "admin"
    assert (
        f"user:{admin_user.username} may not decide it"
        in TransitionEvent.objects.get(task=task, trigger="escalate").reason
    )
    assert str(request.pk) not in inbox(admin_user)
    response = decide(admin_user, request)
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "caused_this_request"
    assert "you escalated it" in response.json()["detail"]
    assert paid() == 0

    other = make_user("acme-admin2", acme, Role.ADMIN)
    assert inbox(other) == [str(request.pk)]
    assert decide(other, request).status_code == 200
    assert run(Task.objects.get(pk=task.pk)).state == State.COMPLETED
    assert paid() == 1


def test_an_escalation_before_the_request_is_raised_bars_the_escalator_too(acme, both, operator):
    invoice = {"invoice_id": "INV-8", "amount": "6000.00", "currency": "USD"}
    task = make_task(acme, task_type="pay_invoice", objective="Pay INV-8", input=invoice, owner=operator)
    control(both, task, "escalate", escalate_to="operator")  # escalated while still ready
    request = pending(run(Task.objects.get(pk=task.pk)))
    response = decide(both, request)
    assert (response.status_code, response.json()["code"]) == (403, "caused_this_request")


def test_whoever_starts_a_task_on_someone_elses_behalf_cannot_approve_it(acme, operator, both, approver):
    """The hook for every start path (an A2A endpoint, an agent adapter): the starter is the creation
    event's actor, whoever owns the task."""
    invoice = {"invoice_id": "INV-9", "amount": "7500.00", "currency": "USD"}
    started = make_task(
        acme,
        task_type="pay_invoice",
        objective="Pay INV-9",
        input=invoice,
        owner=operator,
        actor=Actor.user(both, ActorKind.INTEGRATOR),
    )
    request = pending(run(started))
    response = decide(both, request)
    assert (response.status_code, response.json()["code"]) == (403, "caused_this_request")
    assert "you started this task" in response.json()["detail"]
    assert str(request.pk) not in inbox(both) and str(request.pk) in inbox(approver)


def test_who_released_a_quarantined_payment_cannot_approve_it(acme, operator, both, approver):
    task = payment(acme, operator, "7500.00")
    task = control(operator, task, "quarantine")
    task = run(control(both, task, "release"))
    request = pending(task)
    assert str(request.pk) not in inbox(both)
    response = decide(both, request)
    assert response.status_code == 403, response.content
    assert response.json()["code"] == "caused_this_request"
    assert "you released it" in response.json()["detail"]
    assert decide(approver, pending(task)).status_code == 200
    assert run(Task.objects.get(pk=task.pk)).state == State.COMPLETED
    assert paid() == 1


def test_who_starts_a_compensation_run_cannot_approve_it(booking_types, acme, operator, both, approver):
    canceled = canceled_booking(acme, operator, kind=GUARDED)
    key = canceled.outcome["effects_not_undone"][0]["action"]
    response = post(both, f"/api/tasks/{canceled.pk}/compensate/", {"action": key, "reason": "refund it"})
    assert response.status_code == 201, response.content
    request = pending(run(Task.objects.get(pk=response.json()["id"])))
    assert str(request.pk) not in inbox(both)
    response = decide(both, request)
    assert (response.status_code, response.json()["code"]) == (403, "self_approval")
    assert "you started this compensation run" in response.json()["detail"]
    assert decide(approver, request).status_code == 200


def test_a_request_whose_barred_set_was_altered_refuses_everyone_with_a_403(acme, operator, approver):
    """An SQL ``UPDATE`` that breaks the recorded set cannot open the request to anyone (nor 500)."""
    request = pending(payment(acme, operator, "7500.00"))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE approvals_approvalrequest SET barred = %s WHERE id = %s", ['["nobody"]', request.pk]
        )
    response = decide(approver, request)
    assert (response.status_code, response.json()["code"]) == (403, "separation_unreadable")
    console = Client()
    console.force_login(approver)
    assert console.get(f"/console/approvals/{request.pk}/").status_code == 200
    assert api_client_for(approver).get(f"/api/approvals/{request.pk}/").status_code == 200
    assert paid() == 0
