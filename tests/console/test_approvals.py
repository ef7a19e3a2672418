"""The approver's console: landing, badge, inbox paging and filters, repeat diffs, confirmation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from guardian.shortcuts import assign_perm

from approvals import services as approvals
from approvals.digest import digest
from approvals.models import ApprovalRequest
from approvals.services import DECIDE
from audit.models import TransitionEvent
from tasks import checkpoints, decisions, registry
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tenancy.services import role_group
from tests.conftest import make_task, make_user
from tests.second_factor import sign_in

pytestmark = pytest.mark.django_db
WORKER = Actor.worker("tests")


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def ask(task: Task, *, trigger: str = Trigger.STEP, record_version: str = "1", **facts) -> ApprovalRequest:
    """Advance ``task`` to the refund's approval step, the way a worker does, and return its request."""
    kind = registry.get(task.task_type)
    now = timezone.now()
    progress = checkpoints.Progress(
        step="approve",
        facts={
            **kind.initial_facts(task.input),
            "order_status": "delivered",
            "order_total": "100.00",
            "refund_card": "visa-4242",
            **facts,
        },
        evidence=[
            checkpoints.EvidenceRef(
                system="orders", record_id="A-1", record_version=record_version, fetched_at=now
            )
        ],
    )
    task = advance(task.id, task.state_version, State.READY, actor=WORKER, trigger=trigger, progress=progress)
    decisions.commit(
        task, approvals.request_decision(task, kind, kind.step("approve"), progress, now=now), actor=WORKER
    )
    return ApprovalRequest.objects.filter(task=task).latest("created_at")


def many_pending(tenant, count: int, *, hours: int = 5) -> list[ApprovalRequest]:
    """``count`` pending requests the tenant's approvers may decide, inserted in bulk."""
    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(
            tenant=tenant,
            task_type="refund_request",
            objective=f"Bulk refund {i}",
            input={},
            state=State.WAITING_APPROVAL,
            state_version=3,
            policy_version="p1",
            wait_deadline=now + timedelta(days=1),
            created_at=now,
            updated_at=now,
            state_entered_at=now,
        )
        for i in range(count)
    )
    fields = {"step": "pay_refund", "connector": "payments", "effect": {"kind": "refund", "amount": "1.00"}}
    requests = ApprovalRequest.objects.bulk_create(
        ApprovalRequest(
            task=task,
            tenant=tenant,
            step="approve",
            action_step="pay_refund",
            waiting_version=3,
            consequential=fields,
            digest=digest(fields),
            policy_reason="four eyes",
            policy_version="p1",
            requested_by=f"task:{task.id}",
            allowed_decisions=["approve", "reject"],
            expires_at=now + timedelta(hours=hours, minutes=i),
            created_at=now - timedelta(seconds=i),
        )
        for i, task in enumerate(tasks)
    )
    assign_perm(DECIDE, role_group(tenant, Role.APPROVER), ApprovalRequest.objects.filter(tenant=tenant))
    return requests


def login_lands_on(user) -> str:
    response = sign_in(Client(), user)  # the password, and the code when asked (approvers)
    return response.request["PATH_INFO"]


def test_an_approver_lands_on_the_inbox_after_login(approver):
    assert login_lands_on(approver) == "/console/approvals/"


def test_an_operator_lands_on_the_queue_after_login(operator):
    assert login_lands_on(operator) == "/console/"


def test_the_badge_counts_what_the_approver_may_decide(acme, approver, operator):
    many_pending(acme, 3)
    page = client_for(approver).get("/console/").content.decode()
    assert 'class="pending-count"' in page and ">3</span>" in page
    assert 'class="pending-count"' not in client_for(operator).get("/console/").content.decode()


def test_the_badge_is_capped(acme, approver):
    many_pending(acme, 101)
    assert ">99+</span>" in client_for(approver).get("/console/").content.decode()


def test_the_inbox_pages_by_keyset_and_shows_a_total(acme, approver):
    made = many_pending(acme, 55)
    client = client_for(approver)
    first = client.get("/console/approvals/")
    assert "55 requests" in first.content.decode()
    assert len(first.context["page"].rows) == 50 and first.context["page"].next_cursor
    second = client.get("/console/approvals/", {"after": first.context["page"].next_cursor})
    seen = [r.pk for r in first.context["page"].rows] + [r.pk for r in second.context["page"].rows]
    assert sorted(seen) == sorted(r.pk for r in made) and not second.context["page"].next_cursor


def test_the_inbox_sorts_by_time_left(acme, approver):
    many_pending(acme, 3, hours=5)
    urgent = (
        many_pending(acme, 0) or ApprovalRequest.objects.filter(tenant=acme).order_by("created_at").first()
    )
    ApprovalRequest.objects.filter(pk=urgent.pk).update(expires_at=timezone.now() + timedelta(minutes=5))
    rows = client_for(approver).get("/console/approvals/", {"sort": "time_left"}).context["page"].rows
    assert rows[0].pk == urgent.pk


def test_the_inbox_filters_are_selects_by_task_type_and_tenant(acme, globex, approver):
    many_pending(acme, 2)
    page = client_for(approver).get("/console/approvals/", {"task_type": "pay_invoice"})
    html = page.content.decode()
    assert '<select name="task_type"' in html and '<select name="tenant"' in html
    assert page.context["page"].rows == []
    assert len(client_for(approver).get("/console/approvals/", {"tenant": "acme"}).context["page"].rows) == 2
    # A tenant the approver has no role in is not a choice: it filters nothing and leaks nothing.
    assert "globex" not in html


def test_decided_by_me_lists_my_decisions(acme, approver, operator):
    request = ask(make_task(acme, owner=operator))
    approvals.approval_decide(request, user=approver, decision="reject", digest_seen=request.digest)
    client = client_for(approver)
    assert client.get("/console/approvals/").context["page"].rows == []
    mine = client.get("/console/approvals/", {"status": "decided_by_me"}).context["page"].rows
    assert [r.pk for r in mine] == [request.pk]


def test_a_repeat_request_shows_what_changed_and_links_the_earlier_decision(acme, approver, operator):
    task = make_task(acme, owner=operator)
    first = ask(task)
    approvals.approval_decide(
        first, user=approver, decision="reject", digest_seen=first.digest, comment="wrong amount"
    )
    second = ask(Task.objects.get(pk=task.pk), trigger=Trigger.PROCEED, record_version="2", amount="8.00")
    page = client_for(approver).get(f"/console/approvals/{second.pk}/").content.decode()
    assert "This repeats an earlier request" in page
    assert f'href="/console/approvals/{first.pk}/"' in page and "rejected by acme-approver" in page
    assert "effect.amount" in page and "10.00" in page and "8.00" in page
    assert "evidence orders/A-1" in page


def test_a_warning_shows_when_the_evidence_changed_since_the_request(acme, approver, operator):
    request = ask(make_task(acme, owner=operator))
    ApprovalRequest.objects.filter(pk=request.pk).update(
        evidence=[{**request.evidence[0], "record_version": "0"}]
    )
    page = client_for(approver).get(f"/console/approvals/{request.pk}/").content.decode()
    assert "The evidence changed since this request was made" in page and "version 0 → 1" in page


def test_approve_asks_for_confirmation_before_deciding(acme, approver, operator):
    request = ask(make_task(acme, owner=operator))
    client = client_for(approver)
    url = f"/console/approvals/{request.pk}/decide/"
    asked = client.post(url, {"decision": "approve", "digest": request.digest, "comment": "ok"})
    assert asked.status_code == 200 and "Confirm approval" in asked.content.decode()
    assert ApprovalRequest.objects.get(pk=request.pk).status == "pending"
    done = client.post(
        url, {"decision": "approve", "digest": request.digest, "comment": "ok", "confirmed": "True"}
    )
    assert done.status_code == 302 and ApprovalRequest.objects.get(pk=request.pk).status == "approved"


def test_reject_asks_for_a_reason_and_a_confirmation_then_goes_to_the_inbox(acme, approver, operator):
    request = ask(make_task(acme, owner=operator))
    client = client_for(approver)
    url = f"/console/approvals/{request.pk}/decide/"
    asked = client.post(url, {"decision": "reject", "digest": request.digest})
    assert asked.status_code == 200 and "Confirm the rejection" in asked.content.decode()
    no_reason = client.post(url, {"decision": "reject", "digest": request.digest, "confirmed": "True"})
    assert no_reason.status_code == 400 and "Say why you reject it" in no_reason.content.decode()
    assert ApprovalRequest.objects.get(pk=request.pk).status == "pending"
    done = client.post(
        url, {"decision": "reject", "digest": request.digest, "comment": "wrong card", "confirmed": "True"}
    )
    assert done.status_code == 302 and done["Location"] == "/console/approvals/"  # nothing else waits
    assert ApprovalRequest.objects.get(pk=request.pk).status == "rejected"
    event = TransitionEvent.objects.filter(task_id=request.task_id).order_by("-state_version").first()
    assert "wrong card" in event.reason


def test_after_a_decision_the_approver_goes_to_the_next_request_not_the_task(acme, approver, operator):
    first = ask(make_task(acme, owner=operator))
    second = ask(make_task(acme, owner=operator, objective="Refund order A-2"))
    done = client_for(approver).post(
        f"/console/approvals/{first.pk}/decide/",
        {"decision": "approve", "digest": first.digest, "confirmed": "True"},
    )
    assert done.status_code == 302 and done["Location"] == f"/console/approvals/{second.pk}/"


def test_a_repeat_asked_in_the_same_instant_still_finds_its_earlier_request(acme, approver, operator):
    """The demo seeds both requests in one instant: ordered by time, the repeat found no original."""
    task = make_task(acme, owner=operator)
    first = ask(task)
    other = make_user("acme-approver2", acme, Role.APPROVER)
    approvals.approval_decide(first, user=other, decision="reject", digest_seen=first.digest)
    second = ask(Task.objects.get(pk=task.pk), trigger=Trigger.PROCEED, amount="8.00")
    ApprovalRequest.objects.filter(pk=second.pk).update(created_at=first.created_at)
    page = client_for(approver).get(f"/console/approvals/{second.pk}/").content.decode()
    assert "This repeats an earlier request" in page


def test_another_tenants_approver_sees_neither_the_request_nor_a_count(acme, globex, operator):
    request = ask(make_task(acme, owner=operator))
    stranger = make_user("globex-approver", globex, Role.APPROVER)
    client = client_for(stranger)
    assert client.get(f"/console/approvals/{request.pk}/").status_code == 404
    assert client.get("/console/approvals/").context["page"].rows == []
    assert ">1</span>" not in client.get("/console/").content.decode()


def test_an_approver_without_the_object_permission_has_an_empty_inbox(acme, operator):
    from tenancy.models import Membership

    ask(make_task(acme, owner=operator))
    stray = make_user("stray")
    Membership.objects.create(user=stray, tenant=acme, role=Role.APPROVER)  # no group, so no grant
    assert client_for(stray).get("/console/approvals/").context["page"].rows == []


@pytest.mark.parametrize("pending", [5, 120])
def test_inbox_and_request_page_queries_are_bounded(
    acme, approver, operator, pending, django_assert_max_num_queries
):
    many_pending(acme, pending)
    request = ask(make_task(acme, owner=operator))
    client = client_for(approver)
    with django_assert_max_num_queries(9):
        client.get("/console/approvals/")
    # 12: the money policy's earlier effects for the request's business reference (one indexed read),
    # and the session's second-factor device (SecondFactorMiddleware, every request of an approver).
    with django_assert_max_num_queries(12):
        client.get(f"/console/approvals/{request.pk}/")
