"""Narrow cancels (a model turn, a tool call) and timeouts, each kept apart from a failure.

In-process resume loops on PostgreSQL; the sandbox over real HTTP; the scripted
model with real latency where a turn must be in flight.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from pydantic import BaseModel

from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime import controls, dispatch, engine, runner, sweep
from runtime.heartbeats import Heartbeats
from runtime.llm import ScriptedModel
from tasks import decisions, leases, registry, services
from tasks.exceptions import StaleVersion
from tasks.models import CancelRequest, Task
from tasks.registry import Complete, ModelTurn, TaskType
from tasks.states import State, Trigger
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.runtime.payments import fault, invoice_task, run
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


LIMIT = timedelta(seconds=0.2)


class Nothing(BaseModel):
    """The input of a type that needs none."""


TIMED = TaskType(
    name="timed_turn",
    description="one model turn that must answer within 0.2 s",
    input_model=Nothing,
    max_attempts=2,
    backoff=timedelta(milliseconds=1),
    scripts={"timed@1": lambda facts: "fine"},
    steps=(
        ModelTurn(
            "think", next="done", prompt_id="timed@1", output="thought", timeout=timedelta(seconds=0.2)
        ),
        Complete("done", outcome=("thought",)),
    ),
)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1")


@pytest.fixture
def timed_type():
    registry.register(TIMED)
    yield TIMED
    registry._REGISTRY.pop(TIMED.name)  # a test's throwaway type


def control(task: Task, operator, scope: str) -> controls.ControlResult:
    task = Task.objects.get(pk=task.pk)
    return controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="wrong question",
        scope=scope,
    )


def last_event(task: Task) -> TransitionEvent:
    return TransitionEvent.objects.filter(task=task).latest("state_version")


def test_canceling_a_model_turn_in_flight_stops_it_and_retries_it_without_counting_a_failure(acme, operator):
    task = make_task(acme, task_type="order_lookup", objective="Look A-1 up", input={"order_id": "A-1"})
    beats = Heartbeats(timedelta(seconds=0.6))  # beats every 0.2 s
    beats.start()
    outcome: list[str] = []

    def work() -> None:
        try:
            slow = ScriptedModel(latency=5)
            outcome.append(
                runner.run_task(task.id, worker_id="w", region="default", model=slow, heartbeats=beats)
            )
        finally:
            connections.close_all()

    worker = threading.Thread(target=work)
    started = time.monotonic()
    try:
        worker.start()
        while services.latest_checkpoint(Task.objects.get(pk=task.pk)).step != "summarize":
            assert worker.is_alive(), outcome
            assert time.monotonic() - started < 5, Task.objects.get(pk=task.pk)
            time.sleep(0.05)
        result = control(task, operator, "model_turn")
        assert result.applied and Task.objects.get(pk=task.pk).state == State.READY  # no state change yet
        worker.join(timeout=10)
    finally:
        beats.stop()
    assert time.monotonic() - started < 4  # the 5 s turn did not run to its end
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.attempt) == (State.WAITING_RETRY, 0)  # a cancel is not a failed attempt
    event = last_event(task)
    assert (event.trigger, event.reason_code) == (Trigger.TURN_CANCELED, "cancel:model_turn")
    request = CancelRequest.objects.get(task=task)
    assert (request.scope, request.status) == ("model_turn", "applied")

    # After the backoff the turn runs again and the task completes.
    sweep.sweep(lambda task_id, region: None, now=task.wait_deadline + timedelta(seconds=1))
    task = run(task)
    assert task.state == State.COMPLETED and task.outcome["summary"] == "order A-1 is delivered"


def test_canceling_a_tool_call_not_yet_sent_withdraws_it_and_nothing_is_ever_sent(acme, operator):
    task = invoice_task(acme)
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    intent = engine.decide(point.task, point.checkpoint, model=ScriptedModel(), now=timezone.now())
    decisions.commit(point.task, intent, actor=Actor.worker("w"))  # the intent is committed, not sent
    assert Action.objects.get(task=task).dispatch_state == DispatchState.INTENDED

    control(task, operator, "tool_call")
    task = run(task)
    assert (task.state, task.state_reason) == (State.FAILED, "tool_call_canceled")
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.FAILED and action.last_error.startswith("withdrawn")
    assert action.attempts == 0 and not Effect.objects.filter(system="payments").exists()
    assert CancelRequest.objects.get(task=task).status == CancelRequest.Status.APPLIED


def test_canceling_a_tool_call_already_sent_cannot_unsend_it_and_says_so(acme, operator):
    fault("timeout", seconds=1)  # the payment is made, the answer never comes: in doubt
    task = run(invoice_task(acme))
    assert task.state == State.OUTCOME_UNKNOWN
    control(task, operator, "tool_call")
    time.sleep(1.2)
    task = controls.task_control(
        Task.objects.get(pk=task.pk),
        "reconcile",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="look it up",
    ).task
    task = run(task)
    assert task.state == State.COMPLETED
    assert Effect.objects.filter(system="payments").count() == 1
    request = CancelRequest.objects.get(task=task)
    assert request.status == CancelRequest.Status.NO_EFFECT
    assert "cannot be unsent" in request.resolution


def test_a_step_timeout_is_retried_as_a_timeout_and_fails_only_when_attempts_run_out(acme, timed_type):
    task = make_task(acme, task_type="timed_turn", objective="think", input={})
    slow = ScriptedModel(latency=1.0)
    started = time.monotonic()
    runner.run_task(task.id, worker_id="w", region="default", model=slow)
    assert time.monotonic() - started < 0.9  # given up at the step's limit, not the model's pace
    task = Task.objects.get(pk=task.pk)
    event = last_event(task)
    assert (task.state, task.attempt) == (State.WAITING_RETRY, 1)
    assert (event.trigger, event.reason_code) == (Trigger.STEP_TIMED_OUT, "step_timeout")

    sweep.sweep(lambda task_id, region: None, now=timezone.now() + timedelta(seconds=1))
    runner.run_task(task.id, worker_id="w", region="default", model=slow)
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.outcome) == (
        State.FAILED,
        {"reason": "retries_exhausted", "last_error": "step_timeout"},
    )


def test_timeout_cancel_and_failure_leave_different_marks(acme, timed_type, operator):
    timed_out = make_task(acme, task_type="timed_turn", objective="slow", input={})
    runner.run_task(timed_out.id, worker_id="w", region="default", model=ScriptedModel(latency=1.0))
    failed = make_task(acme, task_type="timed_turn", objective="no model", input={})
    runner.run_task(failed.id, worker_id="w", region="default", model=ScriptedModel(scripts={}))
    late = make_task(
        acme,
        task_type="timed_turn",
        objective="too late",
        input={},
        deadline=timezone.now() + timedelta(seconds=0.2),
    )
    time.sleep(0.3)
    runner.run_task(late.id, worker_id="w", region="default", model=ScriptedModel())
    marks = {
        name: (Task.objects.get(pk=t.pk).state, last_event(t).trigger, last_event(t).reason_code)
        for name, t in (("timeout", timed_out), ("failure", failed), ("deadline", late))
    }
    assert marks == {
        "timeout": (State.WAITING_RETRY, Trigger.STEP_TIMED_OUT, "step_timeout"),
        "failure": (State.WAITING_RETRY, Trigger.ATTEMPT_FAILED, "model_unavailable"),
        "deadline": (State.EXPIRED, Trigger.DEADLINE_PASSED, "deadline_passed"),
    }
    assert Task.objects.get(pk=late.pk).outcome == {"reason": "deadline_passed"}


def run_with_heartbeats(task: Task, **model) -> str:
    """One claim as a worker loop's slot runs it: with the heartbeat thread that signals cancels."""
    beats = Heartbeats(timedelta(seconds=30))  # no beat during the run: only the claim's own read
    try:
        return runner.run_task(
            task.id, worker_id="w", region="default", model=ScriptedModel(**model), heartbeats=beats
        )
    finally:
        beats.stop()


def test_a_cancel_made_while_no_worker_held_the_task_is_read_by_the_worker_that_claims_it(acme, operator):
    task = make_task(acme, task_type="order_lookup", objective="Look A-1 up", input={"order_id": "A-1"})
    control(task, operator, "model_turn")
    run_with_heartbeats(task)
    task = Task.objects.get(pk=task.pk)
    assert (task.state, last_event(task).trigger) == (State.WAITING_RETRY, Trigger.TURN_CANCELED)
    assert CancelRequest.objects.get(task=task).status == CancelRequest.Status.APPLIED


def test_a_cancel_that_never_completed_is_closed_and_does_not_haunt_the_task(acme, operator, admin_user):
    task = make_task(acme, task_type="order_lookup", objective="Look A-1 up", input={"order_id": "A-1"})
    control(task, operator, "task")
    for name in ("quarantine", "release"):  # held before a worker confirmed it, then let go
        current = Task.objects.get(pk=task.pk)
        controls.task_control(
            current, name, user=admin_user, roles=frozenset({"admin"}),
            expected_version=current.state_version, reason="look first",
        )  # fmt: skip
    request = CancelRequest.objects.get(task=task)
    assert request.status == CancelRequest.Status.NO_EFFECT
    assert "left cancel_requested for quarantined" in request.resolution
    assert run_with_heartbeats(task) == State.COMPLETED  # no turn interrupted by the old request


def test_no_send_is_claimed_once_a_tool_call_cancel_committed(acme, operator):
    task = invoice_task(acme)
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    intent = engine.decide(point.task, point.checkpoint, model=ScriptedModel(), now=timezone.now())
    task = decisions.commit(point.task, intent, actor=Actor.worker("w"))
    lease = leases.claim(task.id, worker_id="w", region="default")
    control(task, operator, "tool_call")  # after the worker decided to send, before it claims the send
    action = Action.objects.get(task=task)
    with pytest.raises(StaleVersion, match="cancel request"):
        dispatch.claim(action.pk, lease=lease, at_version=task.state_version)
    assert Action.objects.get(pk=action.pk).dispatch_state == DispatchState.INTENDED
    assert not Effect.objects.filter(system="payments").exists()


def test_a_task_past_its_deadline_with_an_effect_in_doubt_settles_it_before_it_expires(acme):
    fault("timeout", seconds=1)
    task = invoice_task(acme)
    Task.objects.filter(pk=task.pk).update(deadline=timezone.now() + timedelta(seconds=0.5))
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    decisions.commit(
        point.task,
        engine.decide(point.task, point.checkpoint, model=ScriptedModel(), now=timezone.now()),
        actor=Actor.worker("w"),
    )
    Action.objects.filter(task=task).update(dispatch_state=DispatchState.DISPATCHING)  # a send cut short
    time.sleep(0.6)
    report = sweep.sweep(lambda task_id, region: None)
    assert report.expired == 0
    task = run(task)
    assert task.state == State.OUTCOME_UNKNOWN  # reconciled first, never expired over an effect in doubt
