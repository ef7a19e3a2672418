"""The push sender's pipeline (interop.push.Pipeline, runtime.pushes.PushSender): configs in parallel, a
slow receiver holding only its own slot, each config's versions still in order, the batch's reads in a
fixed number of queries, and a change committed while the sender is busy queued without waiting for
the next round."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from interop import push
from interop.models import PushDelivery
from runtime.pushes import PushSender
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.a2a.push_receiver import Receiver
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def loopback_allowed(settings):
    settings.A2A_PUSH_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.A2A_PUSH_BACKOFF_BASE = 0.0
    settings.A2A_PUSH_TIMEOUT = 3.0


@pytest.fixture
def fast() -> Iterator[Receiver]:
    server = Receiver().start()
    yield server
    server.stop()


@pytest.fixture
def slow() -> Iterator[Receiver]:
    server = Receiver(delay=2.0).start()
    yield server
    server.stop()


def _lookup(acme):
    return make_task(acme, task_type="order_lookup", objective="Look up A-1", input={"order_id": "A-1"})


def _step(task, name: str):
    advance(
        task.id,
        task.state_version,
        State.READY,
        actor=Actor.worker("push-test"),
        trigger=Trigger.STEP,
        progress=progress(name),
    )
    task.refresh_from_db()
    return task


def _status(task, version: int) -> str:
    return PushDelivery.objects.get(task=task, state_version=version).status


def test_a_slow_receiver_does_not_hold_up_another_configs_delivery(acme, fast, slow) -> None:
    slow_task, fast_task = _lookup(acme), _lookup(acme)
    push.configure(slow_task, config_id="slow", url=slow.url)
    push.configure(fast_task, config_id="fast", url=fast.url)
    pipeline = push.Pipeline()
    try:
        assert pipeline.step() == 2  # both POSTs started at once
        while _status(fast_task, 1) == PushDelivery.Status.PENDING:
            assert pipeline.busy(), "the fast receiver's delivery was never recorded"
            pipeline.collect(timeout=0.1)
        # The fast config's change is recorded delivered while the slow receiver still holds its POST.
        assert _status(fast_task, 1) == PushDelivery.Status.DELIVERED
        assert _status(slow_task, 1) == PushDelivery.Status.PENDING and pipeline.busy()
        pipeline.collect(timeout=None)
    finally:
        pipeline.close()
    assert _status(slow_task, 1) == PushDelivery.Status.DELIVERED


def test_a_configs_versions_go_out_one_at_a_time_in_order_while_other_configs_go_in_parallel(
    acme, fast
) -> None:
    tasks = [_lookup(acme) for _ in range(3)]
    for index, task in enumerate(tasks):
        push.configure(task, config_id=f"c{index}", url=fast.url, token="t0k3n")
    tasks = [_step(_step(task, "look"), "summarize") for task in tasks]

    pipeline = push.Pipeline()
    try:
        assert pipeline.step() == 3  # one per config: the first pending version of each
        assert sorted(delivery.state_version for delivery in pipeline.in_flight.values()) == [1, 1, 1]
        pipeline.collect(timeout=None)
    finally:
        pipeline.close()
    push.deliver_due()
    push.deliver_due()

    for task in tasks:
        got = [item.idempotency_id for item in fast.unique() if item.idempotency_id.startswith(str(task.id))]
        assert got == [push.idempotency_id(task.id, version) for version in (1, 2, 3)]
    assert all(
        push.verify_signature(item.body, "t0k3n", item.headers[push.SIGNATURE_HEADER])
        for item in fast.received
    )


def test_preparing_a_batch_reads_in_a_fixed_number_of_queries(acme, fast) -> None:
    def prepared(count: int) -> int:
        PushDelivery.objects.all().delete()
        for index in range(count):
            push.configure(_lookup(acme), config_id=f"q{count}-{index}", url=fast.url, token="t")
        push.enqueue()
        batch = push._claim(100, push.timezone.now())
        assert len(batch) == count
        with CaptureQueriesContext(connection) as queries:
            push.prepare(batch)
        return len(queries)

    assert prepared(2) == prepared(12) == 3  # configs, transitions, context ids


def test_a_change_committed_while_the_sender_is_busy_goes_out_before_its_interval(acme, fast) -> None:
    task = _lookup(acme)
    push.configure(task, config_id="live", url=fast.url)
    stop = False
    sender = PushSender("push-test", lambda: stop, interval=60.0).start()  # a round would take a minute
    try:
        deadline = time.monotonic() + 20
        while len(fast.unique()) < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(fast.unique()) == 1
        task = _step(task, "look")  # committed after the sender's first round
        while len(fast.unique()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [item.idempotency_id for item in fast.unique()] == [
            push.idempotency_id(task.id, 1),
            push.idempotency_id(task.id, 2),
        ]
    finally:
        stop = True
        sender.join(10)
    assert not sender.thread.is_alive()
