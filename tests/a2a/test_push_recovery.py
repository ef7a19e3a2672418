"""Push delivery in production's shape: a real ``manage.py run_worker --sweep`` process runs the task and
sends its status changes (nobody calls ``deliver_due`` by hand), a loopback receiver gets each exactly once
after deduplication, in order, also when the worker is SIGKILLed mid-task and when the receiver answers 500
three times first; a receiver that keeps failing raises the ``push_receiver_failing`` alert."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from audit.models import TransitionEvent
from interop import push
from interop.models import PushDelivery
from runtime import alerts
from runtime.models import Alert, AlertKind
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.a2a.push_receiver import Receiver
from tests.conftest import make_task, progress
from tests.workflow import WorkerProcess, put_order, stop_all, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

WORKER_ENV = {
    "A2A_PUSH_ALLOWED_HOSTS": "127.0.0.1",
    "A2A_PUSH_INTERVAL": "0.2",
    "A2A_PUSH_BACKOFF_BASE": "0.1",
    "A2A_PUSH_TIMEOUT": "2",
}


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.A2A_PUSH_ALLOWED_HOSTS = ["127.0.0.1"]


@pytest.fixture
def workers(live_server, tmp_path):
    started: list[WorkerProcess] = []

    def start(**kwargs) -> WorkerProcess:
        worker = WorkerProcess(f"{live_server.url}/sandbox", tmp_path, extra_env=WORKER_ENV, **kwargs)
        started.append(worker)
        return worker

    yield start
    stop_all(started)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def _lookup_with_push(acme, receiver: Receiver) -> Task:
    put_order("A-1")
    task = make_task(acme, task_type="order_lookup", objective="Look up A-1", input={"order_id": "A-1"})
    push.configure(task, config_id="hook", url=receiver.url, token="receiver-token-0123456789")
    return task


def _versions(task: Task) -> list[str]:
    return [
        push.idempotency_id(task.id, version)
        for version in TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("state_version", flat=True)
    ]


def _assert_each_change_once_in_order(task: Task, receiver: Receiver) -> None:
    wait_for(lambda: Task.objects.get(pk=task.pk).state == State.COMPLETED, timeout=60, what="completion")
    expected = _versions(task)
    wait_for(lambda: len(receiver.unique()) >= len(expected), timeout=30, what="every push delivered")
    unique = receiver.unique()
    assert [item.idempotency_id for item in unique] == expected  # each once after dedup, in order
    assert unique[-1].payload["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
    for item in unique:
        header = item.headers[push.SIGNATURE_HEADER]
        assert push.verify_signature(item.body, "receiver-token-0123456789", header)
    settled = PushDelivery.objects.filter(task=task).exclude(status="pending")
    wait_for(lambda: settled.count() == len(expected), timeout=10, what="the worker to record each delivery")
    assert set(settled.values_list("status", flat=True)) == {"delivered"}


def test_a_real_worker_delivers_each_status_change_once(acme, receiver, workers) -> None:
    task = _lookup_with_push(acme, receiver)
    workers()
    _assert_each_change_once_in_order(task, receiver)
    assert len(_versions(task)) >= 4  # created, looked up, summarized, completed


def test_a_worker_sigkilled_mid_task_loses_and_repeats_no_status_change(acme, receiver, workers) -> None:
    task = _lookup_with_push(acme, receiver)
    first = workers(pause_after="ready")  # held right after its first commit of the task
    first.wait_paused()
    first.kill()
    assert Task.objects.get(pk=task.pk).state == State.READY  # mid-task
    workers()
    _assert_each_change_once_in_order(task, receiver)


def test_a_receiver_answering_500_three_times_first_still_gets_each_once(acme, workers) -> None:
    receiver = Receiver(fail_first=3).start()
    try:
        task = _lookup_with_push(acme, receiver)
        workers()
        _assert_each_change_once_in_order(task, receiver)
        assert receiver.answered[:3] == [500, 500, 500]
        first = PushDelivery.objects.get(task=task, state_version=1)
        assert (first.attempts, first.last_status) == (4, 200)
    finally:
        receiver.stop()


def _fail_for_good(acme, settings) -> tuple[Task, Receiver]:
    settings.A2A_PUSH_MAX_ATTEMPTS = 2
    settings.A2A_PUSH_BACKOFF_BASE = 0.0
    receiver = Receiver(always_fail=True).start()
    task = make_task(acme, task_type="order_lookup", objective="Look up A-1", input={"order_id": "A-1"})
    push.configure(task, config_id="hook", url=receiver.url, token="t")
    for _ in range(5):
        push.deliver_due()
    return task, receiver


def test_a_receiver_that_keeps_failing_raises_one_alert_that_progress_does_not_clear(acme, settings) -> None:
    task, receiver = _fail_for_good(acme, settings)
    try:
        assert PushDelivery.objects.get(task=task).status == "failed"
        alerts.scan()
        alert = Alert.objects.get(task=task, kind=AlertKind.PUSH_RECEIVER_FAILING, cleared_at__isnull=True)
        assert "push" in alert.cause
        # The task moves on and its next change fails too: the same alert stays open, not a new one.
        advance(task.id, 1, State.READY, actor=Actor.worker("w"), trigger=Trigger.STEP, progress=progress())
        for _ in range(5):
            push.deliver_due()
        alerts.scan()
        assert list(Alert.objects.filter(task=task).values_list("pk", "cleared_at")) == [(alert.pk, None)]
    finally:
        receiver.stop()


def test_the_alert_clears_when_the_receiver_recovers_or_the_config_is_deleted(acme, settings) -> None:
    task, receiver = _fail_for_good(acme, settings)
    try:
        alerts.scan()
        receiver.always_fail = False  # it is fixed: the next change is delivered
        advance(task.id, 1, State.READY, actor=Actor.worker("w"), trigger=Trigger.STEP, progress=progress())
        push.deliver_due()
        alerts.scan()
        assert Alert.objects.get(task=task).cleared_at is not None
        receiver.always_fail = True
        worker = Actor.worker("w")
        advance(task.id, 2, State.READY, actor=worker, trigger=Trigger.STEP, progress=progress("b"))
        for _ in range(5):
            push.deliver_due()
        alerts.scan()
        assert Alert.objects.filter(task=task, cleared_at__isnull=True).count() == 1
        push.delete_config(task, "hook")
        alerts.scan()
        assert not Alert.objects.filter(task=task, cleared_at__isnull=True).exists()
    finally:
        receiver.stop()


def test_beat_sends_pushes_through_a_registered_celery_task(acme, receiver, settings) -> None:
    from config.celery import app as celery_app

    entry = settings.CELERY_BEAT_SCHEDULE["a2a-push"]
    assert entry["task"] == "interop.push_deliver" and entry["schedule"] == settings.A2A_PUSH_INTERVAL
    celery_app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    task = _lookup_with_push(acme, receiver)
    assert celery_app.tasks["interop.push_deliver"]() == 1
    assert [item.idempotency_id for item in receiver.unique()] == _versions(task)
