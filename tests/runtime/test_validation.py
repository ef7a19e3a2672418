"""Resume validation (``runtime.validation``): what must still hold before a task leaves a wait.

One test per verdict: deadline passed -> expire; step unknown -> quarantine;
owner lost access -> quarantine; approver lost the role -> reapprove; runtime
config withdrawn -> replan with the current one, or quarantine; policy changed
-> replan or proceed, as the task type says; evidence changed -> refresh,
vanished -> quarantine, unreachable -> retry, unstorable -> quarantine. For an
agent run (the support agent): its call approvals count as approvals in force;
a changed tool set -> replan (or reapprove, as the type says), a tool it
already called removed -> quarantine, the model it asks retired -> quarantine.
End-to-end tests drive a refund through the in-process resume loop; the others
ask ``validate`` directly for its verdict on a task resuming from a checkpoint
built for it. Evidence comes from the sandbox over real HTTP (``live_server``).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from demo.sandbox.models import Fault
from runtime import runner, validation
from tasks import checkpoints, registry, services
from tasks.decisions import Decision
from tasks.models import Policy, RuntimeConfig, Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Membership
from tests.conftest import make_task, make_user
from tests.standin import record_server
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


def test_an_answer_resumes_through_validation_to_the_next_wait(acme):
    task = answer(waiting_for_input(acme))
    assert task.state == State.RESUME_VALIDATION
    task = run(task)
    assert task.state == State.WAITING_EXTERNAL
    proceed = TransitionEvent.objects.get(task=task, trigger="proceed")
    assert proceed.reason_code == "revalidated"


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


def test_an_approval_whose_approver_lost_the_role_is_asked_again(acme, operator, approver):
    from approvals.models import ApprovalRequest
    from tenancy.services import revoke_role

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


def resuming(tenant, *, step: str = "ask_customer", evidence: tuple[str, ...] = (), **overrides) -> Task:
    """A refund in ``resume_validation`` whose checkpoint is at ``step`` and rests on orders ``evidence``."""
    task = make_task(tenant, **overrides)
    refs = [
        checkpoints.EvidenceRef(
            system="orders", record_id=record_id, record_version="1", fetched_at=timezone.now()
        )
        for record_id in evidence
    ]
    return advance(
        task.id,
        task.state_version,
        State.RESUME_VALIDATION,
        actor=Actor.worker("w"),
        trigger=Trigger.DEPLOYMENT_CHANGED,
        progress=checkpoints.Progress(step=step, facts={"order_id": "A-1"}, evidence=refs),
    )


def verdict(task: Task) -> Decision:
    kind = registry.get(task.task_type)
    return validation.validate(task, services.latest_checkpoint(task), kind, timezone.now())


def test_a_resume_at_a_step_the_code_no_longer_has_quarantines(acme):
    decision = verdict(resuming(acme, step="renamed_step"))
    assert (decision.to_state, decision.reason_code) == (State.QUARANTINED, "unknown_step")
    assert "renamed_step" in decision.reason


def test_a_policy_change_a_task_type_calls_immaterial_proceeds_under_the_new_policy(acme, monkeypatch):
    kind = dataclasses.replace(registry.get("refund_request"), on_policy_change="proceed")
    monkeypatch.setitem(registry._REGISTRY, "refund_request", kind)
    task = resuming(acme, step="ask_customer")
    Policy.objects.update_or_create(task_type="refund_request", defaults={"version": "2027-01"})
    decision = verdict(task)
    assert (decision.to_state, decision.trigger) == (State.READY, Trigger.PROCEED)
    assert decision.reason_code == "policy_changed_immaterial"
    assert decision.changes == {"policy_version": "2027-01"}
    assert decision.progress.step == "ask_customer"  # carries on where it was, no replan


def test_unchanged_evidence_lets_the_task_proceed_where_it_was(acme):
    decision = verdict(resuming(acme, evidence=("A-1",)))
    assert (decision.to_state, decision.trigger, decision.reason_code) == (
        State.READY,
        Trigger.PROCEED,
        "revalidated",
    )
    assert decision.progress.step == "ask_customer"


def test_evidence_that_vanished_during_the_wait_quarantines(acme):
    decision = verdict(resuming(acme, evidence=("A-1", "A-404")))
    assert (decision.to_state, decision.reason_code) == (State.QUARANTINED, "evidence_missing")
    assert "A-404" in decision.reason


def test_an_evidence_system_that_does_not_answer_makes_the_task_retry_after_a_backoff(acme):
    Fault.objects.create(system="orders", operation="read", kind="error")
    task = resuming(acme, evidence=("A-1",))
    before = timezone.now()
    decision = verdict(task)
    assert (decision.to_state, decision.reason_code) == (State.WAITING_RETRY, "evidence_unavailable")
    assert decision.changes["attempt"] == 1
    backoff = registry.get("refund_request").backoff_for(1)
    assert before + backoff <= decision.changes["wait_deadline"] <= timezone.now() + backoff


def test_evidence_whose_new_version_cannot_be_stored_quarantines(acme, settings):
    with record_server() as orders:
        orders.put_raw("A-1", json.dumps({"id": "A-1", "version": "2\u0000", "data": {}}))
        settings.CONNECTOR_URLS = {**settings.CONNECTOR_URLS, "orders": orders.url}
        decision = verdict(resuming(acme, evidence=("A-1",)))
    assert (decision.to_state, decision.reason_code) == (State.QUARANTINED, "evidence_unstorable")
    assert "version" in decision.reason


def test_a_verdict_is_committed_as_an_audited_transition_with_its_reason(acme):
    task = run(resuming(acme, evidence=("A-404",)))
    event = TransitionEvent.objects.get(task=task, from_state=State.RESUME_VALIDATION)
    assert (event.to_state, event.trigger, event.reason_code) == (
        State.QUARANTINED,
        Trigger.QUARANTINE,
        "evidence_missing",
    )
    assert (task.state, task.state_reason) == (State.QUARANTINED, "evidence_missing")


# --- agent runs (the support agent, an OpenAI Agents SDK agent) ----------------------------------------


def paused_refund(tenant) -> Task:
    """A support agent's refund of 150 (above the limit), paused for its approval."""
    pytest.importorskip("agents")
    put_order("A-1", total="500.00")
    task = make_task(
        tenant,
        task_type="support_agent",
        objective="Customer asks for a refund of A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": "150.00", "currency": "USD"},
    )
    for _ in range(10):
        task = run(task)
        if task.state != State.READY:
            break
    assert task.state == State.WAITING_APPROVAL
    return task


def run_on(task: Task) -> Task:
    for _ in range(20):
        task = run(Task.objects.get(pk=task.pk))
        if task.state not in (State.READY, State.RESUME_VALIDATION):
            break
    return task


def support_with(monkeypatch, *, tools=None, declared=None, **type_changes) -> registry.TaskType:
    """``support_agent`` as a later deployment has it: its agent's function tools (``tools``, by
    name -> tool or None to remove) and declarations (``declared``, by name -> declaration or None)."""
    kind = registry.get("support_agent")
    run_step = kind.step_as("agent", registry.AgentRun)
    agent = run_step.sdk_agent()
    new_tools = [(tools or {}).get(t.name, t) for t in agent.tools]
    new_declared = [(declared or {}).get(d.tool, d) for d in run_step.tools]
    changed_run = dataclasses.replace(
        run_step,
        agent=agent.clone(tools=[t for t in new_tools if t is not None]),
        tools=tuple(d for d in new_declared if d is not None),
    )
    changed = dataclasses.replace(
        kind, steps=tuple(changed_run if s is run_step else s for s in kind.steps), **type_changes
    )
    monkeypatch.setitem(registry._REGISTRY, kind.name, changed)
    return changed


def refund_with_a_note():
    """``refund_order`` as a later version declares it: one more argument, so another schema."""
    from agents import function_tool

    @function_tool
    def refund_order(order_id: str, amount: str, currency: str, note: str = "") -> str:
        """Refund part or all of an order to the card it was paid with, with a note for the customer."""
        raise NotImplementedError("performed by the runtime")

    return refund_order


def test_the_agents_tool_set_is_recorded_with_its_turns(acme):
    from runtime.sdk import toolsets

    task = paused_refund(acme)
    run_step = registry.get("support_agent").step_as("agent", registry.AgentRun)
    recorded = services.latest_checkpoint(task).facts["agent:toolset"]
    assert recorded == toolsets.toolset_id(run_step) and recorded.startswith(toolsets.PREFIX)


def test_the_tool_set_id_follows_the_tools_schemas_and_declarations_not_their_order(monkeypatch):
    pytest.importorskip("agents")
    from runtime.sdk import toolsets

    kind = registry.get("support_agent")
    run_step = kind.step_as("agent", registry.AgentRun)
    before = toolsets.toolset_id(run_step)
    reordered = dataclasses.replace(
        run_step, agent=run_step.sdk_agent().clone(tools=list(reversed(run_step.sdk_agent().tools)))
    )
    assert toolsets.toolset_id(reordered) == before
    renoted = support_with(monkeypatch, tools={"refund_order": refund_with_a_note()})
    assert toolsets.toolset_id(renoted.step_as("agent", registry.AgentRun)) != before
    email = run_step.tool("email_customer")
    approving = dataclasses.replace(
        run_step, tools=(*run_step.tools[:2], dataclasses.replace(email, approval=True))
    )
    assert toolsets.toolset_id(approving) != before


def test_a_tool_changed_during_the_approval_wait_replans_and_asks_the_approval_again(
    acme, approver, monkeypatch
):
    from approvals.models import ApprovalRequest
    from demo.sandbox.models import Effect

    task = paused_refund(acme)
    first = ApprovalRequest.objects.get(task=task)
    support_with(monkeypatch, tools={"refund_order": refund_with_a_note()})
    approve(task, approver)  # approved for the tools as they were

    task = run_on(task)
    replan = TransitionEvent.objects.get(task=task, trigger="replan")
    assert replan.reason_code == "agent_toolset_changed" and "tool set changed" in replan.reason
    assert task.state == State.WAITING_APPROVAL
    again = ApprovalRequest.objects.filter(task=task).latest("created_at")
    assert (again.step, again.status) == (first.step, "pending") and again.pk != first.pk
    assert not Effect.objects.exists()

    approve(task, make_user("acme-approver2", acme, "approver"))  # not the one who approved before
    task = run_on(task)
    assert task.state == State.COMPLETED, task.state_reason
    assert Effect.objects.filter(system="payments").count() == 1


def test_a_tool_changed_where_the_type_says_proceed_asks_again_only_the_approval_in_force(
    acme, approver, monkeypatch
):
    from approvals.models import ApprovalRequest

    task = paused_refund(acme)
    support_with(monkeypatch, tools={"refund_order": refund_with_a_note()}, on_policy_change="proceed")
    approve(task, approver)

    task = run_on(task)
    assert (task.state, task.state_reason) == (State.WAITING_APPROVAL, "agent_toolset_changed")
    assert TransitionEvent.objects.filter(task=task, trigger="reapprove").count() == 1
    assert ApprovalRequest.objects.filter(task=task, status="pending").count() == 1


def test_a_tool_the_agent_already_called_removed_during_the_wait_quarantines(acme, approver, monkeypatch):
    from demo.sandbox.models import Effect

    task = paused_refund(acme)
    support_with(monkeypatch, tools={"lookup_order": None}, declared={"lookup_order": None})
    approve(task, approver)

    task = run_on(task)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "agent_tool_removed")
    assert "lookup_order" in TransitionEvent.objects.filter(task=task).latest("state_version").reason
    assert not Effect.objects.exists()


def test_a_retired_model_the_deployment_still_asks_quarantines_the_agent(acme, approver, settings):
    from demo.sandbox.models import Effect

    task = paused_refund(acme)
    RuntimeConfig.objects.create(  # what the task was started with: still approved
        task_type="support_agent",
        model_id=task.model_id,
        prompt_id=task.prompt_id,
        toolset_id=task.toolset_id,
        approved=True,
        current=True,
    )
    RuntimeConfig.objects.create(
        task_type="support_agent",
        model_id="openai-compatible:old",
        prompt_id="support-agent@1",
        toolset_id="lookup_order+refund_order+email_customer@1",
        approved=False,
    )
    settings.MODEL_BACKEND, settings.MODEL_URL, settings.MODEL_NAME = "openai", "http://127.0.0.1:9/v1", "old"
    approve(task, approver)

    task = run_on(task)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "agent_model_retired")
    assert "openai-compatible:old" in TransitionEvent.objects.filter(task=task).latest("state_version").reason
    assert not Effect.objects.exists()


def test_an_agents_call_approval_whose_approver_lost_the_role_is_asked_again(acme, approver):
    """An agent's approvals are steps made on demand (``<tool>#<call>:approve``), not among the type's
    steps: the approver of the agent's refund loses the role before the task resumes, so the approval
    authorizes nothing and a new request is asked; the refund waits for it, then is paid once."""
    from approvals.models import ApprovalRequest
    from demo.sandbox.models import Effect
    from tenancy.services import revoke_role

    task = paused_refund(acme)
    first = ApprovalRequest.objects.get(task=task)
    assert first.step == "refund_order#call_2_refund_order:approve"
    approve(task, approver)
    revoke_role(approver, acme, "approver")  # before any worker resumed the task

    task = run(Task.objects.get(pk=task.pk))
    assert (task.state, task.state_reason) == (State.WAITING_APPROVAL, "approver_access_revoked")
    again = ApprovalRequest.objects.filter(task=task).latest("created_at")
    assert (again.step, again.status, again.digest) == (first.step, "pending", first.digest)
    assert not Effect.objects.exists()

    approve(task, make_user("acme-approver2", acme, "approver"))
    task = run_on(task)
    assert task.state == State.COMPLETED, task.state_reason
    refunds = Effect.objects.filter(system="payments")
    assert refunds.count() == 1 and refunds.get().request["amount"] == "150.00"
