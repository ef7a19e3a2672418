"""Durable push delivery (interop.push): each status change reaches a loopback receiver exactly once
after deduplication, in order, also through receiver failures; signed with the config's token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from interop import push
from interop.models import PushDelivery
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.a2a.push_receiver import Receiver
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.A2A_PUSH_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.A2A_PUSH_BACKOFF_BASE = 0.0  # retries at once: the test drives the rounds itself
    settings.A2A_PUSH_TIMEOUT = 2.0


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


def _lookup(acme) -> Task:
    return make_task(acme, task_type="order_lookup", objective="Look up A-1", input={"order_id": "A-1"})


def _run_to_rest(task: Task) -> Task:
    """Two steps and the end, as a worker commits them (each a status change the receiver hears of)."""
    worker = Actor.worker("push-test")
    for step in ("look", "summarize"):
        advance(
            task.id,
            task.state_version,
            State.READY,
            actor=worker,
            trigger=Trigger.STEP,
            progress=progress(step),
        )
        task.refresh_from_db()
    advance(task.id, task.state_version, State.COMPLETED, actor=worker, trigger=Trigger.COMPLETE)
    task.refresh_from_db()
    return task


def _drain(rounds: int = 20) -> None:
    for _ in range(rounds):
        push.deliver_due()
        if not PushDelivery.objects.filter(status=PushDelivery.Status.PENDING).exists():
            return


def _versions(task: Task) -> list[str]:
    return [
        push.idempotency_id(task.id, v)
        for v in TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("state_version", flat=True)
    ]


def test_receiver_gets_each_status_change_once_in_order(acme, receiver) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="c1", url=receiver.url, token="s3cret")
    task = _run_to_rest(task)
    _drain()
    assert task.state == State.COMPLETED
    got = [item.idempotency_id for item in receiver.unique()]
    assert got == _versions(task) and len(got) >= 3
    assert len(receiver.received) == len(got)  # nothing failed: nothing sent twice
    last = receiver.unique()[-1].payload["statusUpdate"]
    assert last["status"]["state"] == "TASK_STATE_COMPLETED"
    assert last["metadata"]["state"] == "completed"
    assert last["metadata"]["stateVersion"] == task.state_version
    assert last["taskId"] == str(task.id)


def test_receiver_answering_500_three_times_still_gets_each_once(acme) -> None:
    receiver = Receiver(fail_first=3).start()
    try:
        task = _lookup(acme)
        push.configure(task, config_id="c1", url=receiver.url, token="t")
        task = _run_to_rest(task)
        _drain()
        assert receiver.answered[:3] == [500, 500, 500]
        assert [item.idempotency_id for item in receiver.unique()] == _versions(task)
        first = PushDelivery.objects.get(task=task, state_version=1)
        assert (first.attempts, first.status, first.last_status) == (4, "delivered", 200)
        assert first.delivered_at is not None and first.delivered_at >= first.changed_at
    finally:
        receiver.stop()


def test_signature_verifies_with_the_token_and_not_with_another(acme, receiver) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="c1", url=receiver.url, token="the-token")
    _drain()
    item = receiver.unique()[0]
    header = item.headers[push.SIGNATURE_HEADER]
    assert push.verify_signature(item.body, "the-token", header)
    assert not push.verify_signature(item.body, "another", header)
    assert not push.verify_signature(item.body + b" ", "the-token", header)
    assert item.headers[push.TOKEN_HEADER] == "the-token"


def test_token_is_stored_sealed(acme, receiver) -> None:
    task = _lookup(acme)
    config = push.configure(task, config_id="c1", url=receiver.url, token="plain-token")
    assert "plain-token" not in str(config.secrets)
    assert push.secret(config, "token") == "plain-token"


def test_receiver_that_keeps_failing_ends_failed_after_the_cap(acme, settings) -> None:
    settings.A2A_PUSH_MAX_ATTEMPTS = 3
    receiver = Receiver(always_fail=True).start()
    try:
        task = _lookup(acme)
        push.configure(task, config_id="c1", url=receiver.url, token="t")
        _drain()
        delivery = PushDelivery.objects.get(task=task)
        assert (delivery.status, delivery.attempts, delivery.last_status) == ("failed", 3, 500)
        assert len(receiver.answered) == 3
    finally:
        receiver.stop()


def test_config_refuses_a_url_that_is_not_allow_listed(acme, settings) -> None:
    settings.A2A_PUSH_ALLOWED_HOSTS = []
    task = _lookup(acme)
    with pytest.raises(push.ConfigRefused) as refused:
        push.configure(task, config_id="c1", url="http://127.0.0.1:9/hook", token="t")
    assert refused.value.field == "url" and not push.live_configs(task).exists()


def test_send_time_screen_refuses_a_host_no_longer_allowed(acme, receiver, settings) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="c1", url=receiver.url, token="t")
    settings.A2A_PUSH_ALLOWED_HOSTS = []  # as if the name now resolved somewhere refused
    _drain()
    delivery = PushDelivery.objects.get(task=task)
    assert delivery.status == "failed" and delivery.last_error.startswith("refused")
    assert receiver.received == []


def test_enqueue_twice_writes_each_delivery_once(acme, receiver) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="c1", url=receiver.url, token="t")
    assert push.enqueue(now=timezone.now()) == 1
    assert push.enqueue() == 0


def test_a_config_without_a_token_is_sent_unsigned(acme, receiver) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="c1", url=receiver.url)
    _drain()
    headers = receiver.unique()[0].headers
    assert push.SIGNATURE_HEADER not in headers and push.TOKEN_HEADER not in headers
    assert headers[push.IDEMPOTENCY_HEADER] == push.idempotency_id(task.id, task.state_version)
