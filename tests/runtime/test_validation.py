"""Waits, expiry, resume validation and deliveries, driven by the in-process resume loop.

Evidence comes from the sandbox over real HTTP (``live_server``); the model is
the deterministic scripted one.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from runtime import controls, runner, sweep
from tasks import services
from tasks.models import ExternalEvent, Policy, RuntimeConfig, Task, TaskInput
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tenancy.models import Membership
from tests.conftest import make_task
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def last_event(task: Task) -> TransitionEvent:
    return TransitionEvent.objects.filter(task=task).latest("state_version")


def waiting_for_input(tenant, **overrides) -> Task:
    task = run(make_task(tenant, **overrides))
    assert task.state == State.WAITING_INPUT
    return task


def answer(task: Task, text: str = "mug") -> Task:
    services.task_provide_input(task, expected_version=task.state_version, answer=text, actor=INTEGRATOR)
    return Task.objects.get(pk=task.pk)


def no_sweep_doorbell(task_id, region) -> None:
    pass


def test_a_refund_runs_to_waiting_input_with_its_evidence_recorded(acme):
    task = waiting_for_input(acme)
    point = services.latest_checkpoint(task)
    assert point.step == "ask_customer"
    assert point.facts["order_status"] == "delivered" and point.facts["triage"] == "refund"
    assert point.facts["triage_model"] == "scripted-v1"
    assert task.wait_deadline is not None and task.wait_deadline > timezone.now()


def test_an_answer_resumes_through_validation_to_the_next_wait(acme):
    task = answer(waiting_for_input(acme))
    assert task.state == State.RESUME_VALIDATION
    task = run(task)
    assert task.state == State.WAITING_EXTERNAL
    proceed = TransitionEvent.objects.get(task=task, trigger="proceed")
    assert proceed.reason_code == "revalidated"


def test_the_same_answer_posted_twice_applies_once(acme):
    task = waiting_for_input(acme)
    version = task.state_version
    first = services.task_provide_input(task, expected_version=version, answer="mug", actor=INTEGRATOR)
    again = services.task_provide_input(
        Task.objects.get(pk=task.pk), expected_version=version, answer="mug", actor=INTEGRATOR
    )
    assert (first.applied, again.applied) == (True, False)
    assert TaskInput.objects.filter(task=task).count() == 1
    assert Task.objects.get(pk=task.pk).state_version == version + 1


def test_a_duplicate_external_event_applies_once(acme, approver):
    task = run(answer(waiting_for_input(acme)))
    assert task.state == State.WAITING_EXTERNAL
    deliveries = [
        services.task_deliver_event(
            Task.objects.get(pk=task.pk),
            event_key="ship-1",
            event_type="shipment.returned",
            payload={"tracking_number": "TRK-1"},
            actor=INTEGRATOR,
        )
        for _ in range(3)
    ]
    assert [d.applied for d in deliveries] == [True, False, False]
    assert ExternalEvent.objects.filter(task=task).count() == 1
    assert TransitionEvent.objects.filter(task=task, trigger="external_event").count() == 1
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL
    approve(task, approver)
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED and task.outcome["return_tracking"] == "TRK-1"


def test_an_event_that_arrives_early_is_kept_and_applied_when_the_task_waits_for_it(acme):
    task = waiting_for_input(acme)
    early = services.task_deliver_event(
        task,
        event_key="ship-0",
        event_type="shipment.returned",
        payload={"tracking_number": "EARLY"},
        actor=INTEGRATOR,
    )
    assert early.applied and "stored" in early.note
    task = run(answer(Task.objects.get(pk=task.pk)))
    assert task.state == State.WAITING_APPROVAL  # went straight past waiting_external
    assert TransitionEvent.objects.filter(task=task, trigger="await_external").count() == 0
    assert services.latest_checkpoint(task).facts["return_tracking"] == "EARLY"


def test_a_wait_past_its_deadline_expires_through_the_sweep(acme):
    task = waiting_for_input(acme)
    report = sweep.sweep(no_sweep_doorbell, now=task.wait_deadline + timedelta(seconds=1))
    task = Task.objects.get(pk=task.pk)
    assert report.expired == 1
    assert (task.state, task.outcome["reason"]) == (State.EXPIRED, "wait_expired")
    assert last_event(task).trigger == "wait_expired"


def test_a_task_past_its_deadline_expires_on_resume(acme):
    task = waiting_for_input(acme, deadline=timezone.now() + timedelta(seconds=2))
    Task.objects.filter(pk=task.pk).update(deadline=timezone.now() - timedelta(seconds=1))
    task = run(answer(task))
    assert (task.state, task.state_reason) == (State.EXPIRED, "deadline_passed")


def test_a_policy_change_during_the_wait_replans_from_the_evidence(acme):
    task = waiting_for_input(acme)
    Policy.objects.update_or_create(task_type="refund_request", defaults={"version": "2027-01"})
    task = run(answer(task))
    replan = TransitionEvent.objects.get(task=task, trigger="replan")
    assert replan.reason_code == "policy_changed"
    assert task.policy_version == "2027-01"
    # Replanning re-read the evidence and re-triaged, but did not ask the customer again.
    assert task.state == State.WAITING_EXTERNAL
    assert TransitionEvent.objects.filter(task=task, trigger="request_input").count() == 1


def test_evidence_that_changed_during_the_wait_is_refreshed_not_reused(acme):
    task = waiting_for_input(acme)
    put_order("A-1", status="returned", total="100.00")  # version 2
    task = run(answer(task))
    refresh = TransitionEvent.objects.get(task=task, trigger="refresh")
    assert "orders/A-1 v1 -> v2" in refresh.reason
    assert services.latest_checkpoint(task).facts["order_status"] == "returned"
    # The fresh evidence changed the model's decision: a returned order goes to manual review.
    assert (task.state, task.state_reason) == (State.FAILED, "refund_needs_manual_review")


def test_an_unapproved_runtime_config_is_replaced_by_the_current_one(acme):
    RuntimeConfig.objects.create(
        task_type="refund_request",
        model_id="scripted-v1",
        prompt_id="refund-triage@1",
        toolset_id="orders+payments@1",
        approved=True,
        current=True,
    )
    task = waiting_for_input(acme)
    RuntimeConfig.objects.filter(task_type="refund_request").update(approved=False, current=False)
    RuntimeConfig.objects.create(
        task_type="refund_request",
        model_id="scripted-v1",
        prompt_id="refund-triage@2",
        toolset_id="orders+payments@1",
        approved=True,
        current=True,
    )
    task = run(answer(task))
    assert TransitionEvent.objects.get(task=task, trigger="replan").reason_code == "runtime_config_replaced"
    assert task.prompt_id == "refund-triage@2"


def test_a_withdrawn_runtime_config_with_no_replacement_quarantines(acme):
    RuntimeConfig.objects.create(
        task_type="refund_request",
        model_id="scripted-v1",
        prompt_id="refund-triage@1",
        toolset_id="orders+payments@1",
        approved=True,
        current=True,
    )
    task = waiting_for_input(acme)
    RuntimeConfig.objects.update(approved=False, current=False)
    task = run(answer(task))
    assert (task.state, task.state_reason) == (State.QUARANTINED, "runtime_config_unapproved")


def test_an_owner_who_lost_access_quarantines_the_resume(acme, operator):
    task = waiting_for_input(acme, owner=operator)
    Membership.objects.filter(user=operator).delete()
    task = run(answer(task))
    assert (task.state, task.state_reason) == (State.QUARANTINED, "owner_access_revoked")


def test_a_checkpoint_naming_a_step_the_code_no_longer_has_quarantines(acme):
    from tests.foreign_checkpoints import written_as

    # Written by a deployment whose workflow still had that step.
    with written_as(body=lambda row: row.body.replace('"gather_evidence"', '"renamed_step"')):
        task = make_task(acme)
    task = run(task)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "unknown_step")


def test_a_stale_decision_is_discarded_not_applied(acme, admin_user, monkeypatch):
    """A worker whose task moved on while it was thinking commits nothing."""
    from runtime import engine

    task = make_task(acme)
    real_decide = engine.decide

    def decide_slowly(task, checkpoint, **kwargs):
        decision = real_decide(task, checkpoint, **kwargs)
        controls.task_control(
            task,
            "escalate",
            user=admin_user,
            roles=frozenset({"admin"}),
            expected_version=task.state_version,
            reason="meanwhile",
        )
        return decision

    monkeypatch.setattr(engine, "decide", decide_slowly)
    outcome = runner.run_task(task.id, worker_id="slow", region="default")
    assert outcome == "stale_version"
    task = Task.objects.get(pk=task.pk)
    assert task.state_version == 2 and last_event(task).trigger == "escalate"


def test_a_ready_task_from_another_deployment_is_revalidated_before_it_resumes(acme, settings):
    task = make_task(acme)
    settings.DEPLOYMENT_ID = "2026-12-01"
    task = run(task)
    assert task.state == State.WAITING_INPUT
    triggers = list(
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("trigger", flat=True)
    )
    assert triggers[:3] == ["start", "deployment_changed", "proceed"]
    assert services.latest_checkpoint(task).deployment == "2026-12-01"


def test_an_approval_whose_approver_lost_the_role_is_asked_again(acme, operator, approver):
    from approvals.models import ApprovalRequest
    from tenancy.services import revoke_role
    from tests.workflow import approve

    task = run(answer(waiting_for_input(acme, owner=operator)))
    services.task_deliver_event(
        task,
        event_key="s",
        event_type="shipment.returned",
        payload={"tracking_number": "T"},
        actor=INTEGRATOR,
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL
    approve(task, approver)
    revoke_role(approver, acme, "approver")  # before any worker resumed the task
    task = run(Task.objects.get(pk=task.pk))
    assert (task.state, task.state_reason) == (State.WAITING_APPROVAL, "approver_access_revoked")
    assert TransitionEvent.objects.filter(task=task, trigger="reapprove").count() == 1
    assert ApprovalRequest.objects.filter(task=task).count() == 2


def test_an_event_delivered_while_the_worker_decides_to_wait_is_not_lost(acme, monkeypatch):
    from runtime import engine

    task = answer(waiting_for_input(acme))
    real_decide = engine.decide

    def decide_then_event_arrives(task, checkpoint, **kwargs):
        decision = real_decide(task, checkpoint, **kwargs)
        if decision and decision.to_state == State.WAITING_EXTERNAL:
            services.task_deliver_event(
                Task.objects.get(pk=task.pk),
                event_key="ship-race",
                event_type="shipment.returned",
                payload={"tracking_number": "RACE"},
                actor=INTEGRATOR,
            )
        return decision

    monkeypatch.setattr(engine, "decide", decide_then_event_arrives)
    assert runner.run_task(task.id, worker_id="w", region="default") == "stale_version"
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.READY  # the wait was never entered
    monkeypatch.setattr(engine, "decide", real_decide)
    task = run(task)
    assert task.state == State.WAITING_APPROVAL
    assert services.latest_checkpoint(task).facts["return_tracking"] == "RACE"


def test_a_step_that_blows_up_quarantines_its_task_instead_of_crash_looping(acme, settings):
    settings.LEDGER_CONNECTORS = {}  # a misconfigured deployment: the payment connector is gone
    from ledger import connectors

    connectors.get.cache_clear()
    task = make_task(
        acme, task_type="pay_invoice", objective="Pay", input={"invoice_id": "I-1", "amount": "5.00"}
    )
    assert runner.run_task(task.id, worker_id="w", region="default") == "step_error"
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "step_error")
    assert "LookupError" in last_event(task).reason
    connectors.get.cache_clear()


def test_answering_a_task_whose_checkpoint_is_unreadable_is_a_409_not_a_500(acme, operator):
    from tasks.models import Checkpoint
    from tests.conftest import api_client_for

    task = waiting_for_input(acme)
    Checkpoint.objects.filter(task=task, state_version=task.state_version).update(body="garbage")
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/input/",
        {"expected_version": task.state_version, "payload": {"answer": "x"}},
        format="json",
    )
    # Edited behind the application's back: refused on its digest before it is parsed.
    assert response.status_code == 409 and response.json()["code"] == "checkpoint_digest_mismatch"
