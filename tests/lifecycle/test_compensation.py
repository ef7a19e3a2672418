"""Compensation runs: a canceled task's report offers to undo what it left done, as new actions.

In-process resume loops on PostgreSQL; the sandbox over real HTTP.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.utils import timezone

from approvals.models import ApprovalRequest
from approvals.services import ApprovalRefused, approval_decide
from demo.sandbox.models import Effect, Fault
from ledger.models import Action, DispatchState
from protection import retention
from runtime import controls
from tasks import compensation, registry, services
from tasks.exceptions import TransitionNotAllowed
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor
from tenancy.models import Role
from tenancy.services import grant_role
from tests.api.conftest import post_json, url
from tests.conftest import make_task
from tests.lifecycle.booking import BOOKING, GUARDED, booking_types, canceled_booking, sandbox
from tests.runtime.payments import run

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["booking_types", "sandbox"]  # fixtures


@pytest.fixture(autouse=True)
def _world(sandbox, booking_types):
    """The sandbox over live HTTP and the booking types, for every test here."""


def undo(task: Task, operator, reason: str = "refund the room") -> tuple[Task, bool]:
    key = task.outcome["effects_not_undone"][0]["action"]
    return compensation.start(task, key, user=operator, reason=reason)


def test_the_cancel_report_offers_the_undo_step_and_taking_it_sends_a_new_linked_action(acme, operator):
    task = canceled_booking(acme, operator)
    booked = Action.objects.get(task=task)
    [left] = task.outcome["effects_not_undone"]
    assert (left["action"], left["compensation"]) == (booked.idempotency_key, "unbook")
    [offer] = compensation.offers(task)
    assert (offer.action, offer.step, offer.run) == (booked, "unbook", None)
    version = task.state_version

    run_task, created = undo(task, operator)
    again, created_again = undo(task, operator, reason="clicked twice")
    assert created and not created_again and again.pk == run_task.pk  # one run per undone effect
    assert (run_task.rerun_of_id, run_task.task_type, run_task.tenant_id) == (task.pk, BOOKING.name, acme.pk)
    assert run_task.compensates == booked and run_task.owner == operator  # owned by the one who asked
    # The database holds it too: a second live run of the same action cannot be inserted.
    with pytest.raises(IntegrityError):
        services.task_create(
            tenant=acme,
            task_type=BOOKING.name,
            objective="a racing second run",
            input={"city": "Oslo"},
            actor=Actor.system("tests"),
            compensates=booked,
        )

    run_task = run(run_task)
    assert (run_task.state, run_task.state_reason) == (State.COMPLETED, "compensated")
    undone = Action.objects.get(task=run_task)
    assert undone.compensation_of_id == booked.pk and undone.dispatch_state == DispatchState.SUCCEEDED
    assert undone.idempotency_key != booked.idempotency_key
    sent = Effect.objects.get(system="tickets", idempotency_key=undone.idempotency_key)
    assert sent.request["booking"] == booked.external_ref  # built from the canceled task's facts
    assert run_task.outcome == {
        "compensated": booked.idempotency_key,
        "by": undone.idempotency_key,
        "external_ref": undone.external_ref,
    }
    # The run did its one step: the type's "done" (and its question) were never reached.
    assert Effect.objects.filter(system="payments").count() == 1
    assert Task.objects.get(pk=task.pk).state_version == version  # the canceled task was never written
    [offer] = compensation.offers(task)
    assert offer.run.pk == run_task.pk and offer.run.state == State.COMPLETED
    assert (offer.undo, offer.open) == (DispatchState.SUCCEEDED, False)
    assert undo(task, operator) == (run_task, False)  # undone once: asking again returns that run


def test_an_effect_settled_by_reconciliation_during_the_cancel_is_undone_with_its_reference(acme, operator):
    # The booking is made but its answer never comes: in doubt when the cancel arrives.
    Fault.objects.create(system="payments", operation="dispatch", kind="timeout", params={"seconds": 1.5})
    task = canceled_booking(acme, operator, stops_at=State.OUTCOME_UNKNOWN)
    booked = Action.objects.get(task=task)
    assert booked.dispatch_state == DispatchState.RECONCILED_SUCCEEDED and booked.external_ref

    run_task = run(undo(task, operator)[0])
    assert run_task.state == State.COMPLETED
    undone = Action.objects.get(task=run_task)
    sent = Effect.objects.get(system="tickets", idempotency_key=undone.idempotency_key)
    assert (
        sent.request["booking"] == booked.external_ref
    )  # never a fact of the canceled task: from the ledger


def test_a_refused_compensation_fails_the_run_and_another_try_can_start(acme, operator):
    task = canceled_booking(acme, operator)
    Fault.objects.create(system="tickets", operation="dispatch", kind="reject")
    first = run(undo(task, operator)[0])
    assert (first.state, first.state_reason) == (State.FAILED, "compensation_rejected")
    assert first.outcome["undoes"] == Action.objects.get(task=task).idempotency_key
    assert Action.objects.get(task=first).dispatch_state == DispatchState.FAILED
    [offer] = compensation.offers(task)
    assert (offer.run, offer.undo, offer.open) == (first, DispatchState.FAILED, True)

    # A compensation run is never rerun whole (that would book again): the next try is a new run.
    with pytest.raises(TransitionNotAllowed, match="not rerun"):
        services.task_rerun(first, actor=Actor.system("tests"), reason="again")
    second, created = undo(task, operator, reason="the ticket system is back")
    assert created and second.pk != first.pk
    assert run(second).state == State.COMPLETED
    assert Effect.objects.filter(system="tickets").count() == 1  # the refused try performed nothing
    assert Effect.objects.filter(system="payments").count() == 1  # and nothing was booked again


@pytest.mark.parametrize("refusal", ["reject", "cancel"])
def test_a_run_whose_call_is_refused_or_canceled_ends_failed_even_where_the_step_goes_on(
    acme, operator, approver, refusal
):
    # GUARDED's unbook goes on to "kept" when refused: the run must end there, not try again.
    task = canceled_booking(acme, operator, kind=GUARDED)
    run_task, _ = undo(task, operator)
    request = ApprovalRequest.objects.get(task=run(run_task))
    approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
    if refusal == "reject":
        Fault.objects.create(system="tickets", operation="dispatch", kind="reject")
    else:
        controls.task_control(
            Task.objects.get(pk=run_task.pk),
            "cancel",
            user=operator,
            roles=frozenset({"operator"}),
            expected_version=Task.objects.get(pk=run_task.pk).state_version,
            reason="not now",
            scope="tool_call",
        )
    run_task = run(Task.objects.get(pk=run_task.pk))
    expected = "compensation_rejected" if refusal == "reject" else "compensation_canceled"
    assert (run_task.state, run_task.state_reason) == (State.FAILED, expected)
    assert Effect.objects.filter(system="tickets", status="succeeded").count() == 0


def test_only_a_canceled_tasks_offered_effects_can_be_undone(acme, operator):
    live = run(make_task(acme, task_type=BOOKING.name, objective="Book Oslo", input={"city": "Oslo"}))
    booked = Action.objects.get(task=live)
    with pytest.raises(compensation.NotCompensable, match="only a canceled task"):
        compensation.start(live, booked.idempotency_key, user=operator, reason="too early")
    task = canceled_booking(acme, operator)
    with pytest.raises(compensation.NotCompensable, match="has no side effect"):
        compensation.start(task, booked.idempotency_key, user=operator, reason="another task's effect")
    assert not Task.objects.filter(rerun_of__isnull=False).exists()


@pytest.mark.parametrize(
    ("decision", "state", "reason"),
    [
        ("approve", State.COMPLETED, "compensated"),
        ("reject", State.FAILED, "compensation_not_approved"),
    ],
)
def test_a_compensation_that_needs_approval_waits_for_it_and_ends_with_the_decision(
    acme, operator, approver, decision, state, reason
):
    task = canceled_booking(acme, operator, kind=GUARDED)
    run_task = run(undo(task, operator)[0])
    assert run_task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=run_task)
    assert (request.step, request.action_step) == ("approve_undo", "unbook")
    approval_decide(request, user=approver, decision=decision, digest_seen=request.digest)
    run_task = run(Task.objects.get(pk=run_task.pk))
    assert (run_task.state, run_task.state_reason) == (state, reason)
    # Sent only with the approver's consent, and then once.
    assert Effect.objects.filter(system="tickets").count() == (1 if decision == "approve" else 0)


def test_the_api_lists_the_offer_starts_one_run_and_links_both_ways(acme, operator, client):
    task = canceled_booking(acme, operator)
    booked = Action.objects.get(task=task)
    client.force_login(operator)
    [offer] = client.get(url(task)).json()["compensations"]
    assert offer == {
        "action": booked.idempotency_key,
        "step": "book",
        "connector": "payments",
        "external_ref": booked.external_ref,
        "compensation": "unbook",
        "run": None,
        "run_state": None,
        "undo_state": None,
        "may_start": True,
    }
    body = {"action": booked.idempotency_key, "reason": "refund the room"}
    started = post_json(client, url(task, "compensate"), body)
    assert started.status_code == 201, started.json()
    again = post_json(client, url(task, "compensate"), body)
    assert again.status_code == 200 and again.json()["id"] == started.json()["id"]
    assert started.json()["compensates"] == {"task": str(task.id), "action": booked.idempotency_key}
    assert started.json()["rerun_of"] == str(task.id)
    [offer] = client.get(url(task)).json()["compensations"]
    assert (offer["run"], offer["run_state"], offer["may_start"]) == (started.json()["id"], "ready", False)
    assert client.get(url(task)).json()["reruns"] == []  # a compensation run is not a rerun


def test_the_api_refuses_what_cannot_be_compensated_with_a_precise_answer(acme, operator, approver, client):
    task = canceled_booking(acme, operator)
    client.force_login(operator)
    unknown = post_json(client, url(task, "compensate"), {"action": "no-such-key", "reason": "r"})
    assert unknown.status_code == 409 and unknown.json()["code"] == "not_compensable"
    assert "has no side effect" in unknown.json()["detail"]
    missing = post_json(client, url(task, "compensate"), {"action": "x"})
    assert missing.status_code == 400 and "reason" in missing.json()
    live = make_task(acme)
    early = post_json(client, url(live, "compensate"), {"action": "x", "reason": "r"})
    assert early.status_code == 409 and "only a canceled task" in early.json()["detail"]
    client.force_login(approver)
    key = Action.objects.get(task=task).idempotency_key
    refused = post_json(client, url(task, "compensate"), {"action": key, "reason": "r"})
    assert refused.status_code == 403
    assert not Task.objects.filter(rerun_of=task).exists()


def test_retention_keeps_a_canceled_task_while_its_run_stays_and_deletes_them_together(acme, operator):
    task = canceled_booking(acme, operator)
    run_task = run(undo(task, operator)[0])
    rules = retention.TenantRules(acme)
    later = timezone.now() + timedelta(days=2 * 365)  # both long past the default deletion age
    # The run's action undoes the canceled task's: that task cannot go while its run stays.
    assert retention.delete_tasks([task.id], rules, later) == 0
    assert Task.objects.filter(pk=task.pk).exists()
    assert retention.delete_tasks([task.id, run_task.id], rules, later) == 2
    assert not Task.objects.filter(pk__in=[task.id, run_task.id]).exists()
    assert not Action.objects.filter(task_id__in=[task.id, run_task.id]).exists()


def test_the_one_who_asks_for_a_compensation_cannot_approve_it(acme, operator):
    grant_role(operator, acme, Role.APPROVER)  # one person may hold both roles
    task = canceled_booking(acme, operator, kind=GUARDED)
    run_task = run(undo(task, operator)[0])
    request = ApprovalRequest.objects.get(task=run_task)
    with pytest.raises(ApprovalRefused):
        approval_decide(request, user=operator, decision="approve", digest_seen=request.digest)
    assert Task.objects.get(pk=run_task.pk).state == State.WAITING_APPROVAL


def test_a_canceled_task_of_a_retired_type_still_shows_and_offers_nothing(acme, operator, client):
    task = canceled_booking(acme, operator)
    registry._REGISTRY.pop(BOOKING.name)
    try:
        assert compensation.offers(task) == []
        client.force_login(operator)
        assert client.get(url(task)).json()["compensations"] == []
        assert client.get(f"/console/tasks/{task.id}/").status_code == 200
    finally:
        registry.register(BOOKING)
