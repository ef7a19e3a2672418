"""The support agent's refusals, decisions and limits, run in-process against the sandbox over HTTP.

What issue 23 asks of the adapter besides surviving crashes (``tests/chaos/test_agent_crashes.py``):
a stored run state that is altered, written by a newer SDK, or names a tool the agent lost is refused
with its reason and stays refused, nothing sent; an approver's decision counts once however often it
is sent; a slow model turn is retried with backoff or stopped by a cancel; the run works from a
thread whose event loop already runs; and the tokens and cost shown for a task are exactly what its
model turns reported.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection, connections
from django.test import Client

from approvals.models import ApprovalDecision, ApprovalRequest
from approvals.services import ApprovalRefused, approval_decide
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action
from reads.task_detail import Sections, read_task_detail
from runtime import controls, runner, sweep
from runtime.heartbeats import Heartbeats
from runtime.models import AgentSnapshot, AgentTurn, Alert, AlertKind, ModelUsage
from runtime.sdk import snapshots
from runtime.sdk.step import _opened  # an AgentTurn row's sealed response, opened as the step does
from tasks import registry
from tasks.models import CancelRequest, Task
from tasks.services import latest_checkpoint
from tasks.states import State, Trigger
from tests.conftest import api_client_for, make_task, make_user
from tests.runtime.payments import run
from tests.workflow import put_order
from workflows.sdk import support as support_agent

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = Sections(
    children=None, cancel_requests=None, reruns=None, pending_approvals=None, approvals=None, actions=None
)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.MODEL_LATENCY_MS = 0
    put_order("A-1", total="500.00")


def support_task(tenant, amount: str = "150.00") -> Task:
    return make_task(
        tenant,
        task_type="support_agent",
        objective="Customer asks for a refund of A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": amount, "currency": "USD"},
    )


def run_until_still(task: Task, limit: int = 40) -> Task:
    for _ in range(limit):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError("the agent did not settle")


def paused(tenant) -> Task:
    """A support task waiting for the refund's approval, its run state stored."""
    task = run_until_still(support_task(tenant))
    assert task.state == State.WAITING_APPROVAL, (task.state_reason, last_reason(task))
    assert AgentSnapshot.objects.filter(task=task).count() == 1
    return task


def last_reason(task: Task) -> str:
    return TransitionEvent.objects.filter(task=task).latest("state_version").reason


def pending(task: Task) -> ApprovalRequest:
    return ApprovalRequest.objects.get(task=task, status="pending")


def decide(task: Task, approver, decision: str = "approve"):
    request = pending(task)
    return approval_decide(request, user=approver, decision=decision, digest_seen=request.digest)


def events(task: Task) -> int:
    return TransitionEvent.objects.filter(task=task).count()


def passes_change_nothing(task: Task) -> None:
    """More worker claims and sweeps leave a held task held: no crash loop, nothing written or sent."""
    before = (events(task), Effect.objects.count(), Action.objects.filter(task=task).count())
    for _ in range(3):
        task = run(task)
        sweep.sweep(lambda task_id, region: None)
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED
    assert (events(task), Effect.objects.count(), Action.objects.filter(task=task).count()) == before


def without_refunds() -> registry.TaskType:
    """support_agent as a deployment that dropped the refund tool would have it: gone from the SDK
    agent and from the step's declarations alike."""
    kind = registry.get("support_agent")
    agent_step = kind.steps[0]
    assert isinstance(agent_step, registry.AgentRun)
    kept = [tool for tool in agent_step.sdk_agent().tools if tool.name != "refund_order"]
    lean = dataclasses.replace(
        agent_step,
        agent=agent_step.sdk_agent().clone(tools=kept),
        tools=tuple(tool for tool in agent_step.tools if tool.tool != "refund_order"),
    )
    return dataclasses.replace(kind, steps=(lean, *kind.steps[1:]))


# --- a stored run state we will not resume from ---------------------------------------------------


def _sql(statement: str, params: list[Any]) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        assert cursor.rowcount == 1


def _edit_body(task: Task) -> None:
    row = AgentSnapshot.objects.get(task=task)
    body = dict(row.body)
    key = next(name for name, value in body.items() if isinstance(value, str) and len(value) > 40)
    value = body[key]
    body[key] = value[:20] + ("A" if value[20] != "A" else "B") + value[21:]  # one character of it
    _sql("UPDATE runtime_agentsnapshot SET body = %s WHERE id = %s", [json.dumps(body), row.pk])


def _edit_mac(task: Task) -> None:
    row = AgentSnapshot.objects.get(task=task)
    mac = ("0" if row.mac[0] != "0" else "1") + row.mac[1:]
    _sql("UPDATE runtime_agentsnapshot SET mac = %s WHERE id = %s", [mac, row.pk])


def _swap_in_another_tasks(task: Task) -> None:
    other = paused(task.tenant)  # another customer's pause at the same point of the same agent
    theirs = AgentSnapshot.objects.get(task=other)
    _sql(
        "UPDATE runtime_agentsnapshot SET body = %s, mac = %s, key_id = %s, size = %s WHERE task_id = %s",
        [json.dumps(theirs.body), theirs.mac, theirs.key_id, theirs.size, task.pk],
    )


@pytest.mark.parametrize("tamper", [_edit_body, _edit_mac, _swap_in_another_tasks])
def test_an_altered_run_state_is_refused_with_an_alert_and_nothing_is_sent(acme, approver, tamper):
    task = paused(acme)
    tamper(task)
    decide(task, approver)
    sent_before = Effect.objects.filter(system="payments").count()

    task = run_until_still(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, snapshots.TAMPERED)
    last = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert last.reason_code == snapshots.TAMPERED
    assert "does not match its MAC" in last.reason or "cannot be opened" in last.reason
    assert Alert.objects.filter(task=task, cleared_at__isnull=True).count() == 1
    assert Effect.objects.filter(system="payments").count() == sent_before == 0
    assert not Effect.objects.filter(system="email").exists()
    passes_change_nothing(task)


def test_the_checkpoint_counts_the_run_states_stored(acme):
    task = paused(acme)

    facts = read_facts(task)
    assert facts[snapshots.fact_name("agent")] == 1  # committed with the pause that stored it


def test_a_run_paused_before_the_count_was_kept_still_has_its_run_state_checked(acme, approver, monkeypatch):
    """A checkpoint without the count (a run begun by an older worker) reads the stored state every
    step, as before: an altered one is refused all the same."""
    with monkeypatch.context() as older:  # a worker that kept no count: its fact is another's name
        older.setattr(snapshots, "fact_name", lambda step: f"{step}:uncounted")
        task = paused(acme)
    assert snapshots.fact_name("agent") not in read_facts(task)
    _edit_mac(task)
    decide(task, approver)

    task = run_until_still(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, snapshots.TAMPERED)
    assert not Effect.objects.exists()


def read_facts(task: Task) -> dict[str, Any]:
    return dict(latest_checkpoint(Task.objects.get(pk=task.pk)).facts)


def test_a_run_state_from_a_newer_sdk_schema_is_refused_with_the_reason_and_nothing_is_sent(acme, approver):
    task = paused(acme)
    stored = AgentSnapshot.objects.get(task=task)
    text = snapshots.opened(stored, readable=frozenset({stored.schema_version}))
    newer = json.dumps({**json.loads(text), "$schemaVersion": "9.99"})
    # Written as a newer worker would: a well-formed row, its MAC right, after the one it replaces.
    snapshots.taken(
        task, stored.step, stored.turns, newer, schema="9.99", sdk_version="9.9.0", now=stored.created_at
    ).save()
    decide(task, approver)

    task = run_until_still(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, snapshots.NEWER_SCHEMA)
    last = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert "SDK 9.9.0" in last.reason and "schema 9.99" in last.reason
    assert not Alert.objects.filter(task=task, kind=AlertKind.EFFECT_DIGEST_MISMATCH).exists()
    assert not Effect.objects.exists()
    passes_change_nothing(task)


def test_a_tool_removed_after_its_call_was_approved_holds_the_task_and_sends_nothing(
    acme, approver, monkeypatch
):
    task = paused(acme)
    decide(task, approver)
    monkeypatch.setitem(registry._REGISTRY, "support_agent", without_refunds())  # the new deployment

    task = run_until_still(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, "agent_tool_removed")
    last = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert "refund_order" in last.reason and "nothing of it was sent" in last.reason
    assert not Effect.objects.exists() and not Action.objects.filter(task=task).exists()
    passes_change_nothing(task)


def test_a_tool_removed_after_its_call_was_rejected_holds_the_run_nothing_sent_no_alert(
    acme, approver, monkeypatch
):
    """The run's recorded turns call a tool the type no longer has: they cannot be replayed, so the
    task is held with that reason (resume validation), nothing sent, and no alert (nobody altered
    anything); more passes change nothing."""
    task = paused(acme)
    decide(task, approver, "reject")
    monkeypatch.setitem(registry._REGISTRY, "support_agent", without_refunds())

    task = run_until_still(Task.objects.get(pk=task.pk))
    held_at = task.state_version
    task = run_until_still(task)

    assert (task.state, task.state_reason) == (State.QUARANTINED, "agent_tool_removed"), last_reason(task)
    assert task.state_version == held_at
    assert not Alert.objects.filter(task=task).exists()
    assert not Effect.objects.exists() and not Action.objects.filter(task=task).exists()


def test_deciding_a_request_whose_tool_was_removed_is_a_clear_refusal_not_a_server_error(
    acme, approver, monkeypatch
):
    task = paused(acme)
    request = pending(task)
    monkeypatch.setitem(registry._REGISTRY, "support_agent", without_refunds())

    with pytest.raises(ApprovalRefused) as refused:
        approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
    assert refused.value.status == 409 and "refund_order" in str(refused.value)

    api = api_client_for(approver).post(
        f"/api/approvals/{request.pk}/decide/",
        {"decision": "approve", "digest": request.digest},
        format="json",
    )
    assert api.status_code == 409, api.content
    assert "refund_order" in json.dumps(api.json())

    console = Client(raise_request_exception=False)
    console.force_login(approver)
    page = console.get(f"/console/approvals/{request.pk}/")
    assert page.status_code == 200
    posted = console.post(
        f"/console/approvals/{request.pk}/decide/",
        {"decision": "approve", "digest": request.digest, "confirmed": "1"},
        follow=True,
    )
    assert posted.status_code == 200 and "refund_order" in posted.content.decode()

    assert not ApprovalDecision.objects.filter(request=request).exists()
    assert Task.objects.get(pk=task.pk).state == State.WAITING_APPROVAL
    assert not Effect.objects.exists()


# --- a decision counts once ------------------------------------------------------------------------


def test_a_rejected_refund_is_told_to_the_agent_which_ends_without_paying(acme, approver):
    task = paused(acme)
    decide(task, approver, "reject")

    task = run_until_still(Task.objects.get(pk=task.pk))

    assert task.state == State.COMPLETED, task.state_reason
    assert "not paid: an approver rejected it" in task.outcome["answer"]
    assert not Effect.objects.exists() and not Action.objects.filter(task=task).exists()
    assert AgentTurn.objects.filter(task=task).count() == 3  # lookup, refund, the sentence saying so


def test_the_same_decision_twice_is_one_transition_and_a_contrary_one_a_conflict(acme, approver):
    task = paused(acme)
    request = pending(task)
    first = approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
    again = approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)

    assert (first.applied, again.applied) == (True, False)
    assert "already approved" in again.note
    with pytest.raises(ApprovalRefused) as contrary:
        approval_decide(request, user=approver, decision="reject", digest_seen=request.digest)
    assert (contrary.value.status, contrary.value.code) == (409, "already_decided")
    assert TransitionEvent.objects.filter(task=task, trigger=Trigger.APPROVAL_DECIDED).count() == 1
    assert ApprovalDecision.objects.filter(request=request).count() == 1

    task = run_until_still(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED
    [refund] = Effect.objects.filter(system="payments")
    assert refund.deliveries == 1


def test_a_double_submitted_console_decision_is_applied_once(acme, approver):
    task = paused(acme)
    request = pending(task)
    console = Client()
    console.force_login(approver)
    form = {"decision": "approve", "digest": request.digest, "confirmed": "1"}

    first = console.post(f"/console/approvals/{request.pk}/decide/", form, follow=True)
    second = console.post(f"/console/approvals/{request.pk}/decide/", form, follow=True)

    assert first.status_code == second.status_code == 200
    assert "Approved. The task moved on" in first.content.decode()
    assert "Nothing changed: this request was already approved" in second.content.decode()
    assert TransitionEvent.objects.filter(task=task, trigger=Trigger.APPROVAL_DECIDED).count() == 1


def test_two_approvers_deciding_at_once_make_one_transition(acme, approver):
    """Two sessions (real connections, real threads) decide the same request at the same moment: one
    decision is applied, the other is told the request was decided."""
    other = make_user("approver-2", acme, "approver")
    task = paused(acme)
    request = pending(task)
    gate = threading.Barrier(2)
    results: dict[str, Any] = {}

    def decide_as(user, decision: str) -> None:
        try:
            fresh = ApprovalRequest.objects.get(pk=request.pk)
            gate.wait(timeout=5)
            results[user.username] = approval_decide(
                fresh, user=user, decision=decision, digest_seen=fresh.digest
            )
        except ApprovalRefused as exc:
            results[user.username] = exc
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=decide_as, args=(approver, "approve")),
        threading.Thread(target=decide_as, args=(other, "reject")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)

    applied = [r for r in results.values() if not isinstance(r, ApprovalRefused) and r.applied]
    refused = [r for r in results.values() if isinstance(r, ApprovalRefused)]
    assert len(applied) == 1 and len(refused) == 1, results
    assert refused[0].status == 409
    assert TransitionEvent.objects.filter(task=task, trigger=Trigger.APPROVAL_DECIDED).count() == 1
    assert ApprovalDecision.objects.filter(request=request).count() == 1


# --- a model turn that is slow -----------------------------------------------------------------------


def with_turn_timeout(seconds: float) -> registry.TaskType:
    kind = registry.get("support_agent")
    agent_step = kind.steps[0]
    timed = dataclasses.replace(agent_step, timeout=timedelta(seconds=seconds))
    return dataclasses.replace(kind, steps=(timed, *kind.steps[1:]))


def end_the_wait(task: Task) -> Task:
    sweep.sweep(lambda task_id, region: None, now=task.wait_deadline + timedelta(seconds=1))
    return Task.objects.get(pk=task.pk)


def test_a_model_turn_that_times_out_is_retried_with_backoff_and_succeeds_once_the_model_is_quick(
    acme, settings, monkeypatch
):
    monkeypatch.setitem(registry._REGISTRY, "support_agent", with_turn_timeout(0.2))
    kind = registry.get("support_agent")
    settings.MODEL_LATENCY_MS = 6000
    task = support_task(acme, amount="30.00")

    waits = []
    for attempt in (1, 2):
        started = time.monotonic()
        task = run(task)
        assert time.monotonic() - started < 4  # given up at the 0.2 s timeout, not the 6 s turn waited out
        assert (task.state, task.state_reason, task.attempt) == (State.WAITING_RETRY, "step_timeout", attempt)
        event = TransitionEvent.objects.filter(task=task).latest("state_version")
        assert (event.trigger, event.reason_code) == (Trigger.STEP_TIMED_OUT, "step_timeout")
        waits.append(task.wait_deadline - event.created_at)
        task = end_the_wait(task)
    assert [round(w.total_seconds()) for w in waits] == [
        round(kind.backoff_for(1).total_seconds()),
        round(kind.backoff_for(2).total_seconds()),
    ]
    assert waits[1] > waits[0]  # backed off further
    assert not AgentTurn.objects.filter(task=task).exists()  # a turn given up is not kept...
    assert not ModelUsage.objects.filter(task=task).exists()  # ...nor counted

    settings.MODEL_LATENCY_MS = 0
    task = run_until_still(task)

    assert task.state == State.COMPLETED, task.state_reason
    assert task.attempt == 0
    assert AgentTurn.objects.filter(task=task).count() == 4
    assert Effect.objects.filter(system="payments").count() == 1


def test_a_model_turn_cancel_interrupts_the_slow_turn_in_flight_without_counting_a_failure(
    acme, operator, settings
):
    settings.MODEL_LATENCY_MS = 5000
    task = support_task(acme, amount="30.00")
    beats = Heartbeats(timedelta(seconds=0.6))  # beats (and reads cancel requests) every 0.2 s
    beats.start()
    outcome: list[str] = []

    def work() -> None:
        try:
            outcome.append(runner.run_task(task.id, worker_id="w", region="default", heartbeats=beats))
        finally:
            connections.close_all()

    worker = threading.Thread(target=work)
    started = time.monotonic()
    try:
        worker.start()
        while not hasattr(Task.objects.get(pk=task.pk), "lease"):  # claimed: the first turn is asked
            assert worker.is_alive(), outcome
            assert time.monotonic() - started < 5
            time.sleep(0.05)
        time.sleep(0.3)
        current = Task.objects.get(pk=task.pk)
        asked = controls.task_control(
            current,
            "cancel",
            user=operator,
            roles=frozenset({"operator"}),
            expected_version=current.state_version,
            reason="wrong question",
            scope="model_turn",
        )
        assert asked.applied
        worker.join(timeout=10)
    finally:
        beats.stop()

    assert time.monotonic() - started < 4  # the 5 s turn did not run to its end
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.attempt) == (State.WAITING_RETRY, 0)
    event = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert (event.trigger, event.reason_code) == (Trigger.TURN_CANCELED, "cancel:model_turn")
    assert CancelRequest.objects.get(task=task).status == CancelRequest.Status.APPLIED
    assert not AgentTurn.objects.filter(task=task).exists()  # the interrupted answer was never kept
    assert not ModelUsage.objects.filter(task=task).exists()

    settings.MODEL_LATENCY_MS = 0
    task = run_until_still(end_the_wait(task))
    assert task.state == State.COMPLETED, task.state_reason


# --- where it runs -----------------------------------------------------------------------------------


def test_the_agent_runs_from_a_thread_whose_event_loop_is_already_running(acme):
    """Called from async code (or from a test thread a browser driver's event loop runs in), the
    SDK's run cannot use this thread's loop: it gets one of its own, and the run is the same."""

    done: list[Task] = []

    async def from_async_code() -> None:
        done.append(run_until_still(support_task(acme, amount="30.00")))

    def thread() -> None:  # a thread of its own, so the loop is this test's whatever ran before it
        try:
            asyncio.run(from_async_code())
        finally:
            connections.close_all()

    caller = threading.Thread(target=thread)
    caller.start()
    caller.join(timeout=60)
    [task] = done

    assert task.state == State.COMPLETED, (task.state_reason, last_reason(task))
    assert AgentTurn.objects.filter(task=task).count() == 4


# --- tokens and cost ----------------------------------------------------------------------------------


def test_the_task_figures_are_the_sum_of_its_recorded_usages_and_those_the_models_counts(
    acme, approver, operator, monkeypatch
):
    reported: list[tuple[int, int]] = []
    answer = support_agent.SupportModel.get_response

    async def counted(self, *args, **kwargs):
        response = await answer(self, *args, **kwargs)
        reported.append((response.usage.input_tokens, response.usage.output_tokens))
        return response

    monkeypatch.setattr(support_agent.SupportModel, "get_response", counted)
    task = paused(acme)
    decide(task, approver)
    task = run_until_still(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED

    rows = list(ModelUsage.objects.filter(task=task).order_by("state_version"))
    assert [(r.input_tokens, r.output_tokens) for r in rows] == reported
    assert len(reported) == 4  # each turn asked of the model once, replays not counted
    recorded = [
        _opened(row.task_id, row.step, row.turn, row.response)["usage"]
        for row in AgentTurn.objects.filter(task=task).order_by("turn")
    ]
    assert [(u["input_tokens"], u["output_tokens"]) for u in recorded] == reported
    prices = {"in": Decimal("0.50"), "out": Decimal("1.50")}  # scripted-support-v1 in MODEL_PRICES
    for row in rows:
        assert row.model_id == "scripted-support-v1"
        assert row.cost == (row.input_tokens * prices["in"] + row.output_tokens * prices["out"]) / 1_000_000

    figures = read_task_detail(task, user=operator, sections=EVERYTHING).usage
    total_in, total_out = sum(i for i, _ in reported), sum(o for _, o in reported)
    total_cost = sum((r.cost for r in rows), Decimal(0))
    assert (figures.turns, figures.input_tokens, figures.output_tokens) == (4, total_in, total_out)
    assert figures.cost == total_cost and figures.unpriced == 0
    body = api_client_for(operator).get(f"/api/tasks/{task.id}/").json()
    assert body["usage"]["turns"] == 4
    assert (body["usage"]["input_tokens"], body["usage"]["output_tokens"]) == (total_in, total_out)
    assert Decimal(body["usage"]["cost"]) == total_cost
    console = Client()
    console.force_login(operator)
    page = console.get(f"/console/tasks/{task.id}/").content.decode()
    assert f"4 turns · {total_in} tokens in, {total_out} out" in page
