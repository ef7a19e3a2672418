"""Real worker processes, SIGKILLed right after a checkpoint commits, then replaced.

Each test starts ``manage.py run_worker`` against the test database and the
sandbox (served by ``live_server``), holds it still right after one semantic
boundary commits, kills it with SIGKILL, and starts a fresh worker. The task
must resume from that checkpoint, reach the right next state, and no step may
have run twice.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect, Fault
from runtime import db
from tasks import services
from tasks.models import Lease, Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.workflow import ROOT, approve, database_url, put_order, sessions_named, state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


def triggers(task: Task) -> list[str]:
    return list(
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("trigger", flat=True)
    )


def checkpoint(task: Task):
    return services.latest_checkpoint(Task.objects.get(pk=task.pk))


def assert_history_is_whole(task: Task) -> None:
    stored = Task.objects.get(pk=task.pk)
    assert verify_task(stored) is None
    versions = list(
        TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("state_version", flat=True)
    )
    assert versions == list(range(1, stored.state_version + 1))


def test_killed_after_the_evidence_checkpoint_a_fresh_worker_resumes_at_triage(acme, workers):
    put_order("A-1", total="100.00")
    task = make_task(acme)
    first = workers(pause_after="step:triage")
    first.wait_paused()
    first.kill()

    assert state_of(task) == (State.READY, 2)
    assert checkpoint(task).step == "triage"
    assert [(e.system, e.record_id, e.record_version) for e in checkpoint(task).evidence] == [
        ("orders", "A-1", "1")
    ]

    workers()
    wait_for(lambda: state_of(task)[0] == State.WAITING_INPUT, what="the fresh worker to reach waiting_input")
    assert triggers(task) == [
        "start",
        "step",
        "step",
        "request_input",
    ]  # evidence was read once, triage ran once
    assert checkpoint(task).facts["triage"] == "refund"
    assert_history_is_whole(task)


def test_killed_after_entering_waiting_input_the_task_waits_and_resumes_on_the_answer(acme, workers):
    put_order("A-1")
    task = make_task(acme)
    first = workers(pause_after="waiting_input")
    first.wait_paused()
    first.kill()
    waiting = state_of(task)
    assert waiting == (State.WAITING_INPUT, 4)

    # The dead worker's lease lapses; the waiting task does not change because of it.
    wait_for(
        lambda: not Lease.objects.filter(task=task, expires_at__gt=timezone.now()).exists(),
        what="lease expiry",
    )
    assert state_of(task) == waiting

    services.task_provide_input(
        Task.objects.get(pk=task.pk), expected_version=4, answer="mug", actor=INTEGRATOR
    )
    workers()
    wait_for(
        lambda: state_of(task)[0] == State.WAITING_EXTERNAL, what="the fresh worker to reach waiting_external"
    )
    assert triggers(task) == [
        "start",
        "step",
        "step",
        "request_input",
        "input_received",
        "proceed",
        "await_external",
    ]
    assert checkpoint(task).facts["damaged_item"] == "mug"
    assert_history_is_whole(task)


def test_killed_at_every_boundary_up_to_the_approval_the_refund_completes_once(acme, approver, workers):
    put_order("A-1")
    task = make_task(acme)
    first = workers(pause_after="waiting_input")
    first.wait_paused()
    first.kill()
    services.task_provide_input(
        Task.objects.get(pk=task.pk), expected_version=4, answer="mug", actor=INTEGRATOR
    )

    second = workers(pause_after="waiting_external")
    second.wait_paused()
    second.kill()
    assert state_of(task)[0] == State.WAITING_EXTERNAL

    delivery = services.task_deliver_event(
        Task.objects.get(pk=task.pk),
        event_key="ship-1",
        event_type="shipment.returned",
        payload={"tracking_number": "TRK-9"},
        actor=INTEGRATOR,
    )
    assert delivery.applied

    third = workers(pause_after="step:approve")  # the checkpoint before requesting approval
    third.wait_paused()
    third.kill()
    assert state_of(task)[0] == State.READY
    assert not ApprovalRequest.objects.filter(task=task).exists()

    fourth = workers(pause_after="waiting_approval")
    fourth.wait_paused()
    fourth.kill()
    assert state_of(task)[0] == State.WAITING_APPROVAL
    assert ApprovalRequest.objects.filter(task=task).count() == 1  # asked once, despite the kill before
    approve(Task.objects.get(pk=task.pk), approver)

    workers()
    wait_for(lambda: state_of(task)[0] == State.COMPLETED, what="completion")
    stored = Task.objects.get(pk=task.pk)
    payment = Effect.objects.get(system="payments")
    assert services.task_outcome(stored) == {
        "order_id": "A-1",
        "amount": "10.00",
        "damaged_item": "mug",
        "return_tracking": "TRK-9",
        "payment_ref": str(payment.pk),
    }
    assert [e.system for e in Effect.objects.order_by("id")] == ["tickets", "payments", "email"]
    assert triggers(task).count("complete") == 1
    assert_history_is_whole(task)


def test_killed_while_waiting_to_retry_a_fresh_worker_retries_after_the_backoff(acme, workers):
    put_order("B-7", status="shipped")
    Fault.objects.create(system="orders", operation="read", kind="error", remaining=1)
    task = make_task(acme, task_type="order_lookup", objective="Look up B-7", input={"order_id": "B-7"})
    first = workers(pause_after="waiting_retry")
    first.wait_paused()
    first.kill()
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.attempt, stored.state_reason) == (
        State.WAITING_RETRY,
        1,
        "evidence_unavailable",
    )

    workers()  # sweeps too: ends the backoff, then resumes
    wait_for(lambda: state_of(task)[0] == State.COMPLETED, what="completion after the retry")
    stored = Task.objects.get(pk=task.pk)
    assert stored.outcome["order_status"] == "shipped"
    assert stored.attempt == 0
    assert triggers(task) == [
        "start",
        "attempt_failed",
        "backoff_elapsed",
        "proceed",
        "step",
        "step",
        "complete",
    ]
    assert_history_is_whole(task)


def test_the_celery_worker_and_beat_drive_tasks_through_a_real_broker(acme, sandbox, tmp_path):
    """No message is published by the test: beat's sweep finds the task in the database."""
    put_order("A-1")
    task = make_task(acme)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "SANDBOX_BASE_URL": sandbox,
        "CELERY_BROKER_URL": "filesystem://",
        "BROKER_DIR": str(tmp_path / "broker"),
        "SWEEP_INTERVAL": "1",
        "CELERY_BEAT_SCHEDULE_FILENAME": str(tmp_path / "beat-schedule"),
    }
    celery = [sys.executable, "-m", "celery", "-A", "config"]
    procs = [
        subprocess.Popen(
            [*celery, "worker", "-Q", "region.default", "-c", "1", "--loglevel=WARNING"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [*celery, "beat", "--loglevel=WARNING"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait_for(lambda: state_of(task)[0] == State.WAITING_INPUT, timeout=60, what="the celery worker")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert triggers(task) == ["start", "step", "step", "request_input"]


def test_worker_stops_cleanly_on_sigterm(acme, workers):
    worker = workers()
    # In its loop (its pool's session is open), not still starting Django: a fixed sleep guessed either.
    wait_for(lambda: sessions_named(db.APPLICATION_NAME) >= 1, what="the worker to open its pool")
    worker.process.terminate()
    assert worker.process.wait(timeout=15) == 0
