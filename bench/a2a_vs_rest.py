"""A2A against REST: the same tasks started and followed to completion through each surface, one run.

What it measures
    ``--tasks`` ``order_lookup`` tasks (read the order from the sandbox over HTTP, a scripted model
    turn of ``--latency-ms``, complete) started and followed by ``--callers`` concurrent callers,
    once through A2A (the real a2a-sdk client: the card fetched from the server, ``SendMessage`` with
    a data part, then ``GetTask`` every ``--poll`` seconds until the task ends) and once through our
    REST API (``POST /api/tasks/``, then ``GET /api/tasks/{id}/`` at the same interval), over real
    HTTP to one gunicorn serving the app, with the same ``run_worker`` processes running both (the
    sandbox, the order system they read, on a gunicorn of its own as in ``e2e.py``).
    A surface's rate is its tasks over the seconds from its first start sent to its last completion
    seen. The phases alternate (REST, A2A, A2A, REST, …) ``--repeat`` times after a small warm-up
    of each; each surface's figure is its median, and A2A / REST is the ratio of the two (goal: at
    least 0.90, A2A within 10 % of REST). Also each start's round trip (p50/p99) and a task's time
    from its start to its completion seen by the caller (p50), and the caller's own CPU per task
    (this process: the a2a-sdk client's protobuf work against plain JSON), which shares the machine.

    Push delivery: after the measured phases, ``--push-tasks`` more A2A tasks (default ``--tasks``, at
    most 100) whose ``SendMessage`` carries a push config (``configuration.taskPushNotificationConfig``)
    naming a receiver on loopback, a thread of this process that records the first arrival of each
    ``X-Push-Idempotency-Id`` and answers 200. The workers' ``--sweep`` threads send
    (``runtime.pushes``: while busy they look for new changes every 0.2 s, idle every
    ``A2A_PUSH_INTERVAL`` seconds, ``--push-interval``; the setting's default unless given; up to 8
    POSTs in flight each, one per config). A status change's latency is its first arrival less its
    transition's ``created_at`` (stamped in the transaction, just before its commit; one clock: one
    machine); p50 and p99. A phase of its own, so that the senders' work does not weigh on A2A's side
    of the ratio.

    The REST API's per-user throttle (``API_THROTTLE_USER``, 600/min by default) is raised for the
    run: one caller here sends hundreds of requests a second. A2A has no throttle of its own.

    Afterwards every task of the run is checked: completed, the outcome's order status is the
    record's, its audit chain verifies, no step committed twice (``verify``; a read retried under
    load is counted, not refused); and every status change of the push phase's tasks arrived exactly
    once after deduplication, in order, signed with the config's token (``check_pushes``). The
    workload sends no side effect (the effects-once check of A2A is tests/a2a/test_end_to_end.py's).

How to run
    make bench-a2a                          # DATABASE_URL defaults to the local server
    .venv/bin/python bench/a2a_vs_rest.py --tasks 800 --repeat 3 --callers 64

    DATABASE_URL names the *server*; the script creates its own database (``--database``, default
    ``bench_a2a_<pid>_<hex>``), copied from the migrated template, and drops it at the end. Results
    are also written as JSON to ``bench/results/`` unless ``--no-save``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Not named a2a.py: `python bench/<script>.py` puts bench/ first on sys.path, where a file of that name
# would stand in for the a2a-sdk's own `a2a` package in every bench script.
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.common import (  # noqa: E402
    DEFAULT_SERVER_URL,
    RESULTS_DIR,
    SERVER_START_TIMEOUT,
    add_database_arguments,
    drop_unless_kept,
    machine_info,
    migrate_database,
    print_machine,
    recreate_database,
    setup_django,
    with_dbname,
)
from bench.e2e import (  # noqa: E402
    DEFAULT_TTL,
    Server,
    Workers,
    _child_env,
    _free_port,
    _make_orders,
    _quantiles,
    _table,
    _terminate,
)

REST, A2A = "REST", "A2A"
PUSH = "A2A+push"  # A2A with a push config on each task: the push phase
GOAL = 0.90  # A2A's tasks/s at least this share of REST's


class AppServer:
    """gunicorn serving the app the callers call (A2A and REST) on a port chosen before it starts, so
    that the card it serves names its own ``/a2a/`` (``PUBLIC_BASE_URL``)."""

    def __init__(self, url: str, sandbox: str, logs: Path, *, workers: int, threads: int):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # Keep-alive past gunicorn's 2 s: a pooled connection idle between two polls is otherwise
        # closed by the server as the client reuses it (a ReadError, no answer), as a load balancer's
        # longer idle timeout in front of gunicorn would prevent in production.
        env = {
            **_child_env(url, sandbox),
            "PUBLIC_BASE_URL": self.base,
            "API_THROTTLE_USER": "1000000/min",
        }
        self.description = f"gunicorn ({workers} processes x {threads} threads)"
        self.log_path = logs / "app.log"
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gunicorn", "config.wsgi:application",
                 "--bind", f"127.0.0.1:{self.port}",
                 "--workers", str(workers), "--threads", str(threads), "--worker-class", "gthread",
                 "--log-level", "warning", "--keep-alive", "60"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            self._wait_ready(timeout=SERVER_START_TIMEOUT)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {self.tail()}")
            try:
                httpx.get(f"{self.base}/healthz", timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise RuntimeError(f"the server did not answer within {timeout:g} s")

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        _terminate(self.process)


class PushReceiver:
    """The caller's push endpoint, on loopback in a thread of this process: the wall-clock time and the
    order of the first arrival of each ``X-Push-Idempotency-Id`` (a repeat, which at-least-once allows,
    is counted and dropped), whether each POST was signed with ``TOKEN``; every POST answered 200."""

    TOKEN = "bench-push-token-0123456789"

    def __init__(self) -> None:
        from interop import push

        self.first: dict[str, tuple[float, int]] = {}  # idempotency id -> (arrival, its rank)
        self.repeats = self.unsigned = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                arrived = time.time()  # before the body is read: the request is here
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                signed = push.verify_signature(
                    body, receiver.TOKEN, self.headers.get(push.SIGNATURE_HEADER, "")
                )
                with receiver.lock:
                    key = self.headers.get(push.IDEMPOTENCY_HEADER, "")
                    if key in receiver.first:
                        receiver.repeats += 1
                    else:
                        receiver.first[key] = (arrived, len(receiver.first))
                    receiver.unsigned += not signed
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/push"
        threading.Thread(target=self.server.serve_forever, name="push-receiver", daemon=True).start()

    def received(self) -> dict[str, tuple[float, int]]:
        with self.lock:
            return dict(self.first)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# ---------------------------------------------------------------------------
# The caller: one event loop, one HTTP client, both surfaces
# ---------------------------------------------------------------------------


@dataclass
class Phase:
    surface: str
    tasks: int
    callers: int
    seconds: float  # first start sent -> last completion seen
    tasks_per_s: float
    start_p50_ms: float
    start_p99_ms: float
    done_p50_ms: float  # one task: start sent -> completion seen
    caller_cpu_ms: float  # this process's CPU per task: the client library's own cost, JSON, HTTP


Start = Callable[[str], Awaitable[str]]  # order id -> task id
Read = Callable[[str], Awaitable[bool]]  # task id -> ended (raises if it ended other than completed)


class Caller:
    """Another system calling us: its token, the card it read, the a2a-sdk client built from it, and
    where it wants status changes pushed in the push phase."""

    def __init__(self, base: str, key: str, callers: int, push_url: str):
        self.base = base
        self.push_url = push_url
        limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
        self.http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=60)
        self.client: Any = None

    async def connect(self) -> None:
        from a2a.client import A2ACardResolver, ClientConfig, create_client

        card = await A2ACardResolver(self.http, self.base).get_agent_card()
        if card.supported_interfaces[0].url != f"{self.base}/a2a/":
            raise RuntimeError(f"the card names {card.supported_interfaces[0].url}, not this server")
        self.client = await create_client(
            card, client_config=ClientConfig(httpx_client=self.http, streaming=False)
        )

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        await self.http.aclose()

    # A2A: SendMessage with a data part (and in the push phase a push config), then GetTask.
    async def a2a_start(self, order_id: str, push: bool = False) -> str:
        from a2a.types import a2a_pb2
        from google.protobuf import struct_pb2

        data = struct_pb2.Value()
        data.struct_value.update({"task_type": "order_lookup", "input": {"order_id": order_id}})
        message = a2a_pb2.Message(
            message_id=f"bench-{uuid.uuid4()}", role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(data=data)]
        )
        request = a2a_pb2.SendMessageRequest(message=message)
        if push:  # the config's id defaults to the task's
            request.configuration.task_push_notification_config.CopyFrom(
                a2a_pb2.TaskPushNotificationConfig(url=self.push_url, token=PushReceiver.TOKEN)
            )
        async for event in self.client.send_message(request):
            return str(event.task.id)
        raise RuntimeError("SendMessage answered nothing")

    async def a2a_push_start(self, order_id: str) -> str:
        return await self.a2a_start(order_id, push=True)

    async def a2a_ended(self, task_id: str) -> bool:
        from a2a.types import a2a_pb2

        task = await self.client.get_task(a2a_pb2.GetTaskRequest(id=task_id))
        if task.status.state == a2a_pb2.TASK_STATE_COMPLETED:
            return True
        if task.status.state != a2a_pb2.TASK_STATE_WORKING:
            raise RuntimeError(f"task {task_id} reads {a2a_pb2.TaskState.Name(task.status.state)}")
        return False

    # REST: POST /api/tasks/, then GET /api/tasks/{id}/.
    async def rest_start(self, order_id: str) -> str:
        body = {
            "task_type": "order_lookup",
            "objective": f"Look up {order_id}",
            "input": {"order_id": order_id},
        }
        response = await self.http.post(f"{self.base}/api/tasks/", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"POST /api/tasks/ answered {response.status_code}: {response.text[:500]}")
        return str(response.json()["id"])

    async def rest_ended(self, task_id: str) -> bool:
        response = await self.http.get(f"{self.base}/api/tasks/{task_id}/")
        if response.status_code != 200:
            raise RuntimeError(
                f"GET /api/tasks/{task_id}/ answered {response.status_code}: {response.text[:500]}"
            )
        state = response.json()["state"]
        if state == "completed":
            return True
        if state in ("failed", "canceled", "expired"):
            raise RuntimeError(f"task {task_id} ended {state}")
        return False

    def surface(self, name: str) -> tuple[Start, Read]:
        starts = {A2A: self.a2a_start, PUSH: self.a2a_push_start, REST: self.rest_start}
        return starts[name], (self.rest_ended if name == REST else self.a2a_ended)


async def run_phase(caller: Caller, surface: str, orders: list[str], callers: int, poll: float) -> Phase:
    """``callers`` concurrent callers, each starting a task and following it until it completes, then
    the next, until ``orders`` are all done."""
    start, ended = caller.surface(surface)
    pending = iter(orders)
    starts: list[float] = []
    lifetimes: list[float] = []

    async def one_caller() -> None:
        for order_id in pending:  # one shared iterator: each order is taken once
            sent = time.perf_counter()
            task_id = await start(order_id)
            starts.append(time.perf_counter() - sent)
            while not await ended(task_id):
                await asyncio.sleep(poll)
            lifetimes.append(time.perf_counter() - sent)

    began, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(one_caller() for _ in range(callers)))
    seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
    start_p50, start_p99 = _quantiles([s * 1000 for s in starts])
    return Phase(
        surface=surface,
        tasks=len(orders),
        callers=callers,
        seconds=seconds,
        tasks_per_s=len(orders) / seconds,
        start_p50_ms=start_p50,
        start_p99_ms=start_p99,
        done_p50_ms=statistics.median(lifetimes) * 1000,
        caller_cpu_ms=cpu * 1000 / len(orders),
    )


def phase_order(repeat: int) -> list[str]:
    """REST, A2A, A2A, REST, …: each surface goes first as often as the other (drift cancels)."""
    pairs = [(REST, A2A) if i % 2 == 0 else (A2A, REST) for i in range(repeat)]
    return [surface for pair in pairs for surface in pair]


async def measure(
    args: argparse.Namespace, base: str, key: str, orders: list[str], workers: Workers, push_url: str
) -> tuple[list[Phase], Phase]:
    """The warm-up, the measured phases, then the push phase (its tasks/s is not part of the ratio)."""
    caller = Caller(base, key, args.callers, push_url)
    try:
        await caller.connect()
        cursor = 0

        def take(count: int) -> list[str]:
            nonlocal cursor
            cursor += count
            return orders[cursor - count : cursor]

        for surface in (REST, A2A):  # the workers' start-up, the server's processes, connections
            await run_phase(caller, surface, take(args.warmup), args.callers, args.poll)
        phases = []
        for surface in phase_order(args.repeat):
            phase = await run_phase(caller, surface, take(args.tasks), args.callers, args.poll)
            workers.check_alive()
            print(f"  {surface:<4}  {phase.tasks} tasks in {phase.seconds:.1f} s: "
                  f"{phase.tasks_per_s:.1f} tasks/s", flush=True)  # fmt: skip
            phases.append(phase)
        pushed = await run_phase(caller, PUSH, take(args.push_tasks), args.callers, args.poll)
        workers.check_alive()
        print(f"  {PUSH}  {pushed.tasks} tasks in {pushed.seconds:.1f} s: {pushed.tasks_per_s:.1f} tasks/s, "
              "each with a push config", flush=True)  # fmt: skip
        return phases, pushed
    finally:
        await caller.close()


# ---------------------------------------------------------------------------
# Set-up, checks, report
# ---------------------------------------------------------------------------


def make_caller(slug: str) -> tuple[Any, str]:
    """A tenant of the run's own and an integrator in it with an API token (read + integrate)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from tenancy.models import Role, Tenant
    from tenancy.services import grant_role, token_create

    tenant = Tenant.objects.create(slug=slug, name=slug)
    user = get_user_model().objects.create_user(username=f"{slug}-caller", password=None)
    grant_role(user, tenant, Role.INTEGRATOR)
    _, key = token_create(user, scopes="read,integrate", expires_at=timezone.now() + timedelta(days=1))
    return tenant, key


def verify(tenant: Any) -> tuple[int, int]:
    """Every task of the run: completed, the record's status in its outcome, its audit chain intact, and
    each step committed once: two ``step`` events (the read, the model turn), one ``complete``, one
    model turn recorded. A read that failed under load and was retried adds its own events (an
    attempt failed, the backoff elapsed) and no second commit of a step. Returns (checked, retried)."""
    from django.db.models import Count

    from audit.models import TransitionEvent
    from audit.verify import verify_task
    from demo.sandbox.models import Record
    from runtime.models import ModelUsage
    from tasks.models import Task

    statuses = dict(Record.objects.filter(system="orders").values_list("record_id", "data__status"))
    triggers: dict[Any, list[str]] = {}
    for task_id, trigger in TransitionEvent.objects.filter(tenant=tenant).values_list("task_id", "trigger"):
        triggers.setdefault(task_id, []).append(trigger)
    turns = dict(
        ModelUsage.objects.filter(task__tenant=tenant, committed=True)
        .values("task_id")
        .annotate(n=Count("id"))
        .values_list("task_id", "n")
    )
    checked = retried = 0
    for task in Task.objects.filter(tenant=tenant):
        if task.state != "completed":
            raise AssertionError(f"task {task.id} ended {task.state} ({task.state_reason})")
        if task.outcome["order_status"] != statuses[task.input["order_id"]]:
            raise AssertionError(f"task {task.id} reported {task.outcome}")
        if broken := verify_task(task):
            raise AssertionError(f"audit chain broken: {broken}")
        seen = triggers[task.id]
        if (seen.count("step"), seen.count("complete"), turns.get(task.id)) != (2, 1, 1):
            raise AssertionError(
                f"task {task.id}: a step committed twice ({seen}, {turns.get(task.id)} turns)"
            )
        retried += len(seen) > 4
        checked += 1
    return checked, retried


@dataclass
class Pushes:
    tasks: int  # of the push phase, one push config each
    expected: int  # their status changes (transition events)
    delivered: int  # of those, arrived: each once after deduplication, in order, signed
    repeats: int  # POSTs of a change that had arrived already (at least once allows them)
    latency_p50_ms: float  # a change's commit to its first arrival
    latency_p99_ms: float
    interval_s: float  # A2A_PUSH_INTERVAL the senders ran with
    senders: int  # run_worker --sweep processes, each with its sending thread


def check_pushes(receiver: PushReceiver, tenant: Any, *, interval: float, senders: int) -> Pushes:
    """Wait (the workers still running) until every status change of the push phase's tasks has arrived;
    check each arrived once after deduplication, in its task's order, signed, and none that did not
    happen; their latencies. The phase's tasks are all completed: no change is still to come."""
    from audit.models import TransitionEvent
    from interop import push
    from interop.models import PushConfig

    pushed_tasks = PushConfig.objects.filter(tenant=tenant).values("task_id")
    events = TransitionEvent.objects.filter(task_id__in=pushed_tasks)
    changes = {  # idempotency id -> (task, version, commit time)
        push.idempotency_id(task_id, version): (task_id, version, created_at.timestamp())
        for task_id, version, created_at in events.values_list("task_id", "state_version", "created_at")
    }
    timeout = 60 + 10 * interval
    deadline = time.monotonic() + timeout
    while not changes.keys() <= receiver.received().keys() and time.monotonic() < deadline:
        time.sleep(0.1)
    received = receiver.received()
    if missing := changes.keys() - received.keys():
        raise AssertionError(
            f"{len(missing)} of {len(changes)} status changes not pushed within {timeout:g} s: "
            f"{sorted(missing)[:3]}"
        )
    if extra := received.keys() - changes.keys():
        raise AssertionError(f"pushes of status changes that never happened: {sorted(extra)[:3]}")
    if receiver.unsigned:
        raise AssertionError(f"{receiver.unsigned} pushes not signed with the config's token")
    ranks: dict[Any, list[tuple[int, int]]] = {}  # task -> (version, arrival rank) of each change
    for key, (task_id, version, _) in changes.items():
        ranks.setdefault(task_id, []).append((version, received[key][1]))
    for task_id, arrivals in ranks.items():
        order = [rank for _, rank in sorted(arrivals)]
        if order != sorted(order):
            raise AssertionError(f"task {task_id}: its status changes arrived out of order")
    p50, p99 = _quantiles([(received[key][0] - at) * 1000 for key, (_, _, at) in changes.items()])
    return Pushes(
        tasks=len(ranks),
        expected=len(changes),
        delivered=len(changes.keys() & received.keys()),
        repeats=receiver.repeats,
        latency_p50_ms=p50,
        latency_p99_ms=p99,
        interval_s=interval,
        senders=senders,
    )


def summarize(phases: list[Phase]) -> dict[str, Any]:
    by = {surface: [p for p in phases if p.surface == surface] for surface in (REST, A2A)}
    median = {surface: statistics.median(p.tasks_per_s for p in runs) for surface, runs in by.items()}
    ratio = median[A2A] / median[REST]
    return {
        "tasks_per_s": median,
        "a2a_over_rest": ratio,
        "goal": GOAL,
        "met": ratio >= GOAL,
        "start_p50_ms": {s: statistics.median(p.start_p50_ms for p in runs) for s, runs in by.items()},
        "start_p99_ms": {s: statistics.median(p.start_p99_ms for p in runs) for s, runs in by.items()},
        "done_p50_ms": {s: statistics.median(p.done_p50_ms for p in runs) for s, runs in by.items()},
        "caller_cpu_ms": {s: statistics.median(p.caller_cpu_ms for p in runs) for s, runs in by.items()},
    }


def render(args: argparse.Namespace, summary: dict[str, Any], pushes: Pushes) -> str:
    rows = [
        (surface, str(args.tasks), str(args.repeat), str(args.callers), f"{args.latency_ms:g}",
         f"{summary['tasks_per_s'][surface]:.1f}",
         f"{summary['start_p50_ms'][surface]:.0f} / {summary['start_p99_ms'][surface]:.0f}",
         f"{summary['done_p50_ms'][surface]:.0f}", f"{summary['caller_cpu_ms'][surface]:.1f}")
        for surface in (REST, A2A)
    ]  # fmt: skip
    table = _table(
        ("surface", "tasks", "runs", "callers", "model ms", "tasks/s (median)", "start ms p50/p99",
         "start to done ms p50", "caller CPU ms/task"),
        rows,
    )  # fmt: skip
    verdict = "met" if summary["met"] else "NOT met"
    return (
        f"{table}\n\nA2A / REST: {summary['a2a_over_rest']:.2f} "
        f"(goal: at least {GOAL:.2f}, A2A within 10 % of REST: {verdict})\n\n"
        f"Push: {pushes.delivered} of {pushes.expected} status changes of {pushes.tasks} tasks delivered, "
        f"each once after dedupe ({pushes.repeats} repeats), in order; status change to delivery "
        f"ms p50 / p99: {pushes.latency_p50_ms:.0f} / {pushes.latency_p99_ms:.0f} "
        f"(A2A_PUSH_INTERVAL {pushes.interval_s:g} s, {pushes.senders} run_worker --sweep senders)"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=400, help="tasks per phase (default 400)")
    parser.add_argument("--repeat", type=int, default=3, help="phases per surface; medians (default 3)")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up tasks per surface (default 20)")
    parser.add_argument("--callers", type=int, default=64, help="concurrent callers (default 64)")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between reads of a task (default 1)")
    parser.add_argument("--workers", type=int, default=2, help="run_worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="run_worker --concurrency: tasks in flight per worker (default 16)")  # fmt: skip
    parser.add_argument("--latency-ms", type=float, default=300,
                        help="the scripted model's answer time, MODEL_LATENCY_MS (default 300)")  # fmt: skip
    parser.add_argument("--idle", type=float, default=0.1, help="run_worker --idle seconds (default 0.1)")
    parser.add_argument("--server-workers", type=int, default=2, help="gunicorn processes (default 2)")
    parser.add_argument("--server-threads", type=int, default=4, help="gunicorn threads each (default 4)")
    parser.add_argument("--push-tasks", type=int, default=None,
                        help="A2A tasks with a push config, after the phases (default: --tasks, "
                        "at most 100)")  # fmt: skip
    parser.add_argument("--push-interval", type=float, default=None,
                        help="A2A_PUSH_INTERVAL of the workers' push senders (default: the setting "
                        "as configured)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    add_database_arguments(parser, "bench_a2a")
    parser.add_argument("--no-save", action="store_true", help="do not write JSON to bench/results/")
    args = parser.parse_args(argv)
    if args.push_tasks is None:
        args.push_tasks = min(args.tasks, 100)
    counts = (args.tasks, args.repeat, args.callers, args.workers, args.concurrency, args.warmup)
    if min(*counts, args.push_tasks) < 1:
        parser.error(
            "counts must be positive (a warm-up of at least one task keeps the workers' start-up out)"
        )
    if args.push_interval is not None and args.push_interval <= 0:
        parser.error("--push-interval must be positive")
    # What bench/e2e.Workers reads: workers as deployed (sweep on, liveness on).
    args.sweep, args.liveness = True, True
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    server_url = os.environ.get("DATABASE_URL") or DEFAULT_SERVER_URL
    url = with_dbname(server_url, args.database)
    recreate_database(server_url, args.database, create=True)
    server: AppServer | None = None
    sandbox: Server | None = None
    workers: Workers | None = None
    receiver: PushReceiver | None = None
    try:
        os.environ["DATABASE_URL"] = url
        # Read by this process and inherited by the servers and workers: the receiver is on loopback.
        os.environ["A2A_PUSH_ALLOWED_HOSTS"] = "127.0.0.1"
        if args.push_interval is not None:
            os.environ["A2A_PUSH_INTERVAL"] = f"{args.push_interval:g}"
        setup_django(debug=False)
        from django.conf import settings
        from django.db import connections

        args.push_interval = settings.A2A_PUSH_INTERVAL
        migrate_database(server_url, args.database, fresh=args.fresh_migrate)
        total = 2 * (args.warmup + args.tasks * args.repeat) + args.push_tasks
        _make_orders(total, random.Random(args.seed))
        orders = [f"E-{i}" for i in range(total)]
        tenant, key = make_caller("bench-a2a")
        connections.close_all()
        receiver = PushReceiver()
        info = machine_info(url)
        print_machine(info, debug=False)
        with tempfile.TemporaryDirectory(prefix="bench-a2a-") as logs_dir:
            logs = Path(logs_dir)
            # The sandbox (the order system the workers read) on a server of its own, as e2e.py runs it:
            # an outside system does not queue behind our callers' requests.
            sandbox = Server("gunicorn", url, logs, workers=1, threads=4)
            server = AppServer(
                url, sandbox.sandbox, logs, workers=args.server_workers, threads=args.server_threads
            )
            print(
                f"run         {args.workers} x manage.py run_worker --concurrency {args.concurrency} "
                f"--sweep, model {args.latency_ms:g} ms; the app on {server.description} at {server.base}; "
                f"{args.callers} callers polling every {args.poll:g} s; then {args.push_tasks} A2A tasks "
                f"pushing each status change to {receiver.url} (A2A_PUSH_INTERVAL "
                f"{args.push_interval:g} s); database {args.database}\n",
                flush=True,
            )
            workers = Workers(args.workers, url, sandbox.sandbox, logs, args, DEFAULT_TTL)
            try:
                phases, pushed = asyncio.run(measure(args, server.base, key, orders, workers, receiver.url))
                pushes = check_pushes(receiver, tenant, interval=args.push_interval, senders=args.workers)
                connections.close_all()
            except Exception:
                print(f"the app server's log:\n{server.tail()}\nworker logs:\n{workers.log_tails()}")
                raise
            workers.stop()
            server.stop()
            sandbox.stop()
            receiver.stop()
            workers = server = sandbox = receiver = None
        verified, retried = verify(tenant)
        if verified != total:
            raise AssertionError(f"{verified} tasks in the database, {total} started")
        if pushes.tasks != args.push_tasks:
            raise AssertionError(f"{pushes.tasks} tasks with a push config, {args.push_tasks} sent one")
        print(f"\nverified    {verified} tasks: completed with the record's status, "
              f"audit chains intact, no step committed twice ({retried} retried a read);\n"
              f"            {pushes.delivered} status changes pushed, each once after dedupe, "
              f"in order, signed\n")  # fmt: skip
        summary = summarize(phases)
        summary["push"] = asdict(pushes)
        table = render(args, summary, pushes)
        print(table)
        if not args.no_save:
            RESULTS_DIR.mkdir(parents=True, exist_ok=True)
            path = RESULTS_DIR / f"a2a-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
            path.write_text(json.dumps({
                "machine": info,
                "args": vars(args),
                "phases": [asdict(p) for p in phases],
                "push_phase": asdict(pushed),
                "summary": summary,
                "table": table,
            }, indent=2))  # fmt: skip
            print(f"\nresults     {path.relative_to(ROOT)}")
        return 0
    finally:
        if workers is not None:
            workers.stop()
        if server is not None:
            server.stop()
        if sandbox is not None:
            sandbox.stop()
        if receiver is not None:
            receiver.stop()
        if "django.db" in sys.modules:
            sys.modules["django.db"].connections.close_all()
        drop_unless_kept(server_url, args.database, args.keep_database)


if __name__ == "__main__":
    sys.exit(main())
