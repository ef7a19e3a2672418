"""RabbitMQ: a node killed or hung mid-run loses no doorbell, pays nothing twice, stops no worker.

``make cluster-test`` (marker ``cluster``). A real cluster of three RabbitMQ
nodes on loopback (``tests.cluster.rabbitmq``); the API under gunicorn, Celery
workers (``celery -A config worker``, ``tests.chaos.processes``) and, at the
end, beat with its sweep, all with a ``CELERY_BROKER_URL`` naming the three
nodes. The region queue is a quorum queue (``config/settings.py``). The payment
system is the sandbox, in this test's process, each payment taking 300 ms.

1. A client creates ``RABBITMQ_TASKS`` invoices (150) through the API: their
   doorbells wait in the region queue, whose leader is the node the API
   published to. Two workers start, connected to that same node.
2. Once a quarter are paid, that node is SIGKILLed (``kill``: the queue's
   leader and every worker's connection die together) or SIGSTOPped
   (``hang``: the connections stay open and nothing answers on them).
   While the queue elects a new leader and the workers reconnect, the
   client creates ``DURING`` more. A worker takes a doorbell again within
   ``STALL_BOUND`` seconds of the fault. Both worker pools run it: prefork
   (the default with RabbitMQ) and threads.
3. No sweep runs until every invoice of step 1 is paid: those are paid on their
   doorbells alone, so none of them was lost. Then beat starts (its sweep every
   second) and rings whatever an outage-time create could not.

What must hold: each invoice paid exactly once at the payment system; every
task completed on its payment; no worker exited; the queue still a quorum
queue, led by a surviving node, with both survivors online; every outage-time
create answered 201, and each of its tasks that needed the sweep has a logged
doorbell failure (nothing lost in silence). The figures (seconds from the fault
to the next doorbell taken and task completed, throughput around it) are printed.

A second test rings a doorbell with a countdown: it waits in RabbitMQ's delayed
queues, not in a worker, and runs once the countdown has passed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from django.db import connection

from demo.sandbox.models import Effect, Fault
from tasks.models import Task
from tasks.states import State
from tenancy.models import Scope
from tenancy.services import token_create
from tests.chaos.processes import CeleryCluster
from tests.chaos.test_standby_failover import WORKER_ENV
from tests.cluster import rabbitmq
from tests.cluster.test_failover import ClusterApi, paid
from tests.cluster.test_rabbitmq_settings import celery_app
from tests.conftest import make_task
from tests.workflow import database_url, put_order, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

TASKS = int(os.environ.get("RABBITMQ_TASKS", "150"))
DURING = 20  # invoices created while the killed node's queue elects a new leader
WORKERS, CONCURRENCY = 2, 4
COUNTDOWN = 16  # one delay level (2**4 s): the message sits in celery_delayed_4 for all of it
# Seconds from the fault to a worker taking a doorbell again. A killed node's connections close at once.
# A hung one is given up on after two missed AMQP heartbeats (CELERY_BROKER_HEARTBEAT, 10 s; a connect
# to it fails after BROKER_SOCKET_TIMEOUT, 5 s), but the survivors cannot set up the worker's new
# connection (they answer nothing, then reset it after 30 s) until they count the hung node as down:
# RabbitMQ's net_ticktime, 60 s by default (45-75 s after the hang).
STALL_BOUND = {"kill": 45, "hang": 90}


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory) -> Iterator[rabbitmq.Cluster]:
    """Three nodes, one cluster, for this module (the countdown test runs first, then the outages, each
    healing what the one before left down)."""
    reason = rabbitmq.unavailable()
    if reason is not None:
        pytest.skip(reason)
    made = rabbitmq.create(tmp_path_factory.mktemp("rabbitmq"))
    try:
        yield made
    finally:
        made.destroy()


@pytest.fixture
def celery(rabbit, sandbox, tmp_path) -> Iterator[CeleryCluster]:
    """A region of Celery processes on the cluster (none started yet); stopped whatever the test did."""
    env = {**WORKER_ENV, "CELERY_BROKER_URL": rabbit.url(), "SANDBOX_BASE_URL": sandbox,
           # Generous: no sweep runs at first, so a step timed out on a loaded machine would wait forever.
           "CONNECTOR_TIMEOUT": "30"}  # fmt: skip
    made = CeleryCluster(tmp_path, env=env)
    try:
        yield made
    finally:
        made.stop()


def invoice(n: int) -> dict:
    """Invoice ``n``: a cent more each, all within the token's daily limit, so none waits for an approver."""
    return {
        "task_type": "pay_invoice",
        "objective": f"Pay INV-MQ-{n:04d}",
        "input": {"invoice_id": f"INV-MQ-{n:04d}", "amount": f"{1 + n / 100:.2f}", "currency": "EUR"},
        "idempotency_key": f"client-order-mq-{n:04d}/pay",
    }


def completions() -> list[float]:
    """When each task completed (epoch seconds, from the audit log), in order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM created_at)::float8 FROM audit_transitionevent"
            " WHERE to_state = %s ORDER BY 1",
            [State.COMPLETED],
        )
        return [at for (at,) in cursor.fetchall()]


def logged_at(log: str, text: str) -> list[float]:
    """When each line of a Celery log holding ``text`` was written (epoch seconds; its ISO time stamps)."""
    return [datetime.fromisoformat(line.split(" ", 1)[0]).timestamp()
            for line in log.splitlines() if text in line and line[:2] == "20"]  # fmt: skip


def unfinished(keys: set[str]) -> set[str]:
    return set(
        Task.objects.filter(idempotency_key__in=keys)
        .exclude(state=State.COMPLETED)
        .values_list("idempotency_key", flat=True)
    )


@pytest.mark.timeout(300)
def test_a_doorbell_rung_with_a_countdown_waits_in_rabbitmq_and_runs_after_it(
    acme, celery, rabbit, tmp_path, monkeypatch
):
    worker = celery.worker(2)
    put_order("L-1")
    # Its doorbell here goes to the test process's in-memory broker: only the one below can run it.
    task = make_task(acme, task_type="order_lookup", objective="Look up L-1", input={"order_id": "L-1"},
                     region=celery.region)  # fmt: skip
    app = celery_app(monkeypatch, tmp_path, rabbit.url(), region=celery.region)
    rung = time.monotonic()
    with app.connection_for_write() as conn:
        app.send_task("tasks.run_task", args=[str(task.id)], countdown=COUNTDOWN, connection=conn)
    # During the countdown the message is in RabbitMQ's delay queue, not held by the worker (a quorum
    # queue's message count is refreshed every few seconds: asked until it shows).
    delay_queue = f"celery_delayed_{COUNTDOWN.bit_length() - 1}"
    waiting = wait_for(lambda: (q := rabbit.queues())[delay_queue]["messages"] == 1 and q,
                       timeout=COUNTDOWN, what=f"the doorbell in {delay_queue}")  # fmt: skip
    assert time.monotonic() - rung < COUNTDOWN
    assert waiting[delay_queue]["type"] == "quorum"
    assert waiting[f"region.{celery.region}"]["messages"] == 0
    assert Task.objects.get(pk=task.pk).state_version == 1  # not run yet
    # Run means taken up: its first step commits, whatever the order system answers under load (with no
    # sweep here, a step that failed would wait for its retry forever).
    wait_for(lambda: Task.objects.get(pk=task.pk).state_version > 1 or not worker.running(),
             timeout=COUNTDOWN + 60, what="the delayed doorbell to run the task")  # fmt: skip
    ran_after = time.monotonic() - rung
    assert worker.running(), worker.output()[-5000:]
    assert ran_after >= COUNTDOWN
    print(
        f"\nrabbitmq countdown: {json.dumps({'countdown_s': COUNTDOWN, 'ran_after_s': round(ran_after, 2)})}"
    )


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pool", ["prefork", "threads"])
@pytest.mark.parametrize(
    "fault",
    [
        "kill",
        "hang",
    ],
)
def test_a_broker_node_killed_or_hung_mid_run_loses_no_doorbell_and_pays_nothing_twice(
    operator, sandbox, rabbit, celery, tmp_path, monkeypatch, fault, pool
):
    rabbit.heal()
    _, token = token_create(operator, scopes=[Scope.INTEGRATE, Scope.READ], expires_at=None)
    Fault.objects.create(
        system="payments", operation="dispatch", kind="latency", remaining=100_000, params={"ms": 300}
    )
    queue = f"region.{celery.region}"
    # The API (its environment is this process's) publishes to the first node it is given.
    monkeypatch.setenv("CELERY_BROKER_URL", rabbit.url())
    monkeypatch.setenv("WORKER_REGION", celery.region)
    monkeypatch.setenv("LOG_LEVEL", "WARNING")
    bodies = [invoice(n) for n in range(TASKS)]
    late = [invoice(n) for n in range(TASKS, TASKS + DURING)]
    api: ClusterApi | None = None
    try:
        api = ClusterApi(database_url(), token, tmp_path / "api.log")
        for body in bodies:  # all created first: the kill lands mid-run, not mid-creation
            assert api.create(body).status_code == 201
        # Every doorbell confirmed into the queue (its message count is refreshed every few seconds).
        try:
            wait_for(lambda: rabbit.queues()[queue]["messages"] == TASKS, timeout=30, what="every doorbell")
        except AssertionError:
            pass
        before = rabbit.queues()[queue]
        assert before["messages"] == TASKS, before
        assert before["type"] == "quorum", before
        assert sorted(before["online"]) == sorted(n.name for n in rabbit.nodes), before
        victim = rabbit.node(before["leader"])
        survivors = [n for n in rabbit.nodes if n is not victim]
        # The workers dial the leader's node first: its death takes their connections with it.
        celery.env["CELERY_BROKER_URL"] = rabbit.url([victim, *survivors])
        started = time.time()
        # Started together: one booting while the other already pays would have it pay the whole run.
        with ThreadPoolExecutor(WORKERS) as starting:
            workers = list(starting.map(lambda i: celery.worker(CONCURRENCY, name=f"worker{i}", pool=pool),
                                        range(WORKERS)))  # fmt: skip
        # Each worker's log names the node it connected to (rabbitmqctl is too slow to ask mid-run here).
        assert all(f"Connected to amqp://***@127.0.0.1:{victim.port}/" in w.output() for w in workers)
        wait_for(lambda: len(paid()) >= TASKS // 4 or not all(w.running() for w in workers),
                 timeout=300, what="a quarter paid")  # fmt: skip
        assert all(w.running() for w in workers), [w.output()[-3000:] for w in workers]
        paid_at_kill = len(paid())
        assert paid_at_kill < TASKS * 3 // 4, f"{paid_at_kill} paid: the kill would not land mid-run"

        killed_at, killed = time.time(), time.monotonic()
        victim.kill() if fault == "kill" else victim.pause()
        # The outage-time creates, meanwhile: a doorbell published to the hung node waits for its confirm.
        creating = ThreadPoolExecutor(1)
        late_creates = creating.submit(lambda: [api.create(body).status_code for body in late])  # type: ignore[union-attr]

        def taken_since() -> float | None:
            """Seconds from the fault to the first doorbell a worker took after it, or None yet."""
            after = [at for w in workers for at in logged_at(w.output(), "] received") if at > killed_at]
            return min(after) - killed_at if after else None

        try:
            wait_for(lambda: taken_since() is not None or not all(w.running() for w in workers),
                     timeout=STALL_BOUND[fault] + 30, what=f"a doorbell taken after the {fault}")  # fmt: skip
        finally:
            print(f"\nrabbitmq {fault} ({pool}): next doorbell taken {taken_since()} s after the fault")
        stall = taken_since()
        assert stall is not None and stall <= STALL_BOUND[fault], [w.output()[-3000:] for w in workers]
        answers = late_creates.result(timeout=300)
        creating.shutdown()
        created_late = time.monotonic() - killed

        # No sweep yet: the invoices created before the kill are paid on their doorbells alone.
        first = {b["idempotency_key"] for b in bodies}
        wait_for(lambda: not unfinished(first) or not all(w.running() for w in workers), timeout=480,
                 what="every invoice created before the kill paid on its doorbell")  # fmt: skip
        assert all(w.running() for w in workers), [w.output()[-5000:] for w in workers]
        doorbells_only = time.monotonic() - killed
        # The outage-time creates: those whose doorbell was published are run by now too (or soon).
        second = {b["idempotency_key"] for b in late}
        try:
            wait_for(lambda: not unfinished(second), timeout=20, what="outage-time invoices on doorbells")
        except AssertionError:
            pass
        needed_sweep = unfinished(second)
        failed_rings = api.log.read_text(errors="replace").count("doorbell failed")
        if needed_sweep:
            beat = celery.beat()
            wait_for(lambda: not unfinished(second) or not beat.running(), timeout=120,
                     what="the sweep to ring what the outage lost")  # fmt: skip
        after = rabbit.queues()[queue]
        assert all(w.running() for w in workers), [w.output()[-5000:] for w in workers]
        reconnected = [w.output().count("Connected to amqp://") for w in workers]
    finally:
        if api is not None:
            api.stop()

    if fault == "kill":
        assert answers == [201] * DURING, answers
    else:
        # While the cluster has not yet given up on the hung node (~60 s) no node confirms a doorbell,
        # and each create's ring tries every node in turn: some creates outlast the client's 20 s
        # timeout, so the careful client sends them again and is answered 200, the task its first
        # try created (the checks below: each invoice once, each task completed).
        assert set(answers) <= {200, 201}, answers
    payments = paid()
    assert {inv: n for inv, n in payments.items() if n != 1} == {}, "an invoice paid twice"
    assert set(payments) == {b["input"]["invoice_id"] for b in bodies + late}, "an invoice never paid"
    refs = {e.request["invoice"]: str(e.pk) for e in Effect.objects.filter(system="payments")}
    tasks = {t.idempotency_key: t for t in Task.objects.all()}
    for body in bodies + late:
        task = tasks[body["idempotency_key"]]
        assert task.state == State.COMPLETED, (task.idempotency_key, task.state)
        assert task.outcome["payment_ref"] == refs[body["input"]["invoice_id"]], task.idempotency_key
    # Nothing lost in silence: each outage-time task left for the sweep had its doorbell fail on record.
    assert len(needed_sweep) <= failed_rings, (needed_sweep, failed_rings)
    assert after["type"] == "quorum", after
    assert after["leader"] in {n.name for n in survivors}, after
    if fault == "kill":
        assert sorted(after["online"]) == sorted(n.name for n in survivors), after
    else:  # a hung node may still count as online until Erlang's distribution gives up on it (~60 s)
        assert {n.name for n in survivors} <= set(after["online"]), after
    assert all(count >= 2 for count in reconnected), reconnected  # each worker connected again

    done = completions()
    next_done = min(at for at in done if at > killed_at)
    outputs = [w.output() for w in workers]
    # Progress resumed: a worker took a doorbell again (necessarily on a new connection, to a survivor).
    taken = min(at for log in outputs for at in logged_at(log, "] received") if at > killed_at)
    back = max(min(at for at in logged_at(log, "Connected to amqp://") if at > killed_at) for log in outputs)

    def rate(start: float, stop: float) -> float:
        return round(sum(start < at <= stop for at in done) / (stop - start), 2)

    shown = {
        "fault": fault,
        "pool": pool,
        "tasks": TASKS,
        "paid_at_kill": paid_at_kill,
        "workers_reconnected_s": round(back - killed_at, 2),
        "kill_to_next_doorbell_taken_s": round(taken - killed_at, 2),
        # A step in flight commits to PostgreSQL whatever happens to the broker.
        "kill_to_next_completion_s": round(next_done - killed_at, 2),
        "completed_in_10s_before_kill": sum(killed_at - 10 < at <= killed_at for at in done),
        "completed_in_10s_after_kill": sum(killed_at < at <= killed_at + 10 for at in done),
        "tasks_per_s_before": rate(max(started, done[0] - 1e-6), killed_at),
        "created_during_outage": DURING,
        "creating_them_took_s": round(created_late, 2),
        "doorbells_failed_during_outage": failed_rings,
        "left_for_the_sweep": len(needed_sweep),
        "first_batch_done_after_kill_s": round(doorbells_only, 2),
        "load_average": os.getloadavg()[0],
    }
    print(f"\nrabbitmq node {fault} ({pool}): {json.dumps(shown)}")
