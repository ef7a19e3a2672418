"""Workers whose clocks are wrong, as real processes under libfaketime, beside workers whose clocks are right.

Leases run on the database's clock: a worker ten minutes ahead takes no lease
from a live worker, a worker ten minutes behind loses none to one whose clock
is right, and a frozen worker's lease lapses one TTL after its last heartbeat
whatever its own clock said. And a worker beyond ``WORKER_MAX_CLOCK_SKEW``
claims nothing and says why in its log.

libfaketime (Debian's ``libfaketime``, installed for ``make test`` by
``scripts/ensure-faketime``) shifts the wall clock of the worker process only:
``FAKETIME_DONT_FAKE_MONOTONIC`` keeps its timers real, as a wrong NTP setting would.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import LeaseTakeover, TransitionEvent
from tasks import liveness
from tasks.models import Lease, Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import WorkerProcess, sessions_named, state_of, wait_for

LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)
LIBFAKETIME = next((path for path in LIBRARIES if path.exists()), None)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(180),
    pytest.mark.skipif(
        LIBFAKETIME is None,
        reason="libfaketime is not installed: apt-get install -y faketime libfaketime",
    ),
]

TTL = 2.0
AHEAD, BEHIND = "+10m", "-10m"
ANY_SKEW = {"WORKER_MAX_CLOCK_SKEW": "3600"}  # a worker that claims whatever its clock: leases must cope
REFUSAL = "refusing to claim tasks: this worker's clock is"


SITE = Path(__file__).parent / "faketime_site"  # time.sleep past a libfaketime bug (its docstring)


def skewed(offset: str) -> dict[str, str]:
    return {
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": str(SITE),
    }


def invoice_task(tenant, number: int = 9) -> Task:
    return make_task(
        tenant,
        task_type="pay_invoice",
        objective=f"Pay INV-{number}",
        input={"invoice_id": f"INV-{number}", "amount": "12.34", "currency": "EUR"},
    )


def database_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def output_of(worker: WorkerProcess) -> str:
    worker.stop()
    return worker.process.stdout.read()


def workers_up(count: int) -> None:
    wait_for(lambda: sessions_named(liveness.APPLICATION_NAME) >= count, timeout=60, what=f"{count} workers")


def test_workers_ten_minutes_ahead_and_behind_refuse_to_claim_and_say_why(acme, workers):
    ahead = workers(lease_ttl=TTL, extra_env=skewed(AHEAD))
    behind = workers(lease_ttl=TTL, extra_env=skewed(BEHIND))
    workers_up(2)
    tasks = [invoice_task(acme, n) for n in range(4)]
    time.sleep(3 * TTL)  # many claim rounds of both
    assert not Lease.objects.filter(task__in=tasks).exists(), "a skewed worker claimed a task"
    assert {state_of(task)[0] for task in tasks} == {State.READY}

    assert ahead.process.poll() is None and behind.process.poll() is None, "a skewed worker exited"
    right = workers(lease_ttl=TTL)
    wait_for(lambda: {state_of(task)[0] for task in tasks} == {State.COMPLETED}, timeout=90, what="the tasks")
    events = TransitionEvent.objects.filter(task__in=tasks, actor_kind="worker")
    actors = set(events.values_list("actor_id", flat=True))
    assert actors == {f"worker:{worker_host()}:{right.process.pid}"}
    for worker, sign in ((ahead, "+"), (behind, "-")):
        said = output_of(worker)
        assert f"{REFUSAL} {sign}6" in said and "WORKER_MAX_CLOCK_SKEW=5" in said, said[-2000:]


def worker_host() -> str:
    return socket.gethostname()  # runtime.workers.worker_id() is host:pid


@pytest.mark.parametrize(
    ("holder_clock", "claimer_clock"),
    [("", AHEAD), (BEHIND, "")],
    ids=["claimer ten minutes ahead", "holder ten minutes behind"],
)
def test_no_lease_is_taken_from_a_live_heartbeating_worker_whatever_the_clocks(
    acme, workers, holder_clock, claimer_clock
):
    task = invoice_task(acme)
    holder_env = {**ANY_SKEW, **(skewed(holder_clock) if holder_clock else {})}
    holder = workers(pause_after="step:pay", lease_ttl=TTL, extra_env=holder_env)
    holder.wait_paused()  # sleeps holding the lease; its heartbeat thread keeps beating
    claimer_env = {**ANY_SKEW, **(skewed(claimer_clock) if claimer_clock else {})}
    claimer = workers(lease_ttl=TTL, extra_env=claimer_env)
    workers_up(2)
    time.sleep(4 * TTL)  # the claimer polls every 0.1 s all along
    lease = Lease.objects.get(task=task)
    assert (lease.worker_id, lease.token) == (f"{worker_host()}:{holder.process.pid}", 1)
    assert not LeaseTakeover.objects.filter(task=task).exists()
    left = (lease.expires_at - database_now()).total_seconds()
    assert 0 < left <= TTL, f"the holder's lease expires {left:.1f} s from the database's now"
    assert claimer.process.poll() is None


def test_a_frozen_worker_ten_minutes_ahead_loses_its_task_one_ttl_after_its_last_heartbeat(acme, workers):
    task = invoice_task(acme)
    frozen_env = {**ANY_SKEW, **skewed(AHEAD), "DURABLE_PAUSE_MODE": "stop"}
    frozen = workers(pause_after="step:pay", lease_ttl=TTL, extra_env=frozen_env)
    frozen.wait_paused()
    wait_for(lambda: _stopped(frozen), timeout=10, what="the worker to stop itself")
    stopped_at = timezone.now()
    left = (Lease.objects.get(task=task).expires_at - database_now()).total_seconds()
    assert left <= TTL, f"the frozen worker's lease outlives its freeze by {left:.0f} s"

    workers(lease_ttl=TTL)
    wait_for(lambda: LeaseTakeover.objects.filter(task=task).exists(), timeout=60, what="the takeover")
    [takeover] = LeaseTakeover.objects.filter(task=task)
    took = (takeover.taken_at - stopped_at).total_seconds()
    assert took < TTL + 5, f"taken over {took:.1f} s after the freeze, with a {TTL:g} s TTL"
    wait_for(lambda: state_of(task)[0] == State.COMPLETED, timeout=60, what="the task to complete")
    frozen.kill()  # a stopped process would not answer the teardown's SIGTERM


def _stopped(worker: WorkerProcess) -> bool:
    with open(f"/proc/{worker.process.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"
