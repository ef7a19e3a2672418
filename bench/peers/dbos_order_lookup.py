"""``order_lookup`` written for DBOS Transact: the peer our end-to-end benchmark is compared with.

Runs in ``bench/peers/.venv`` only (``requirements.txt``); the product never imports it.

The work mirrors the product's ``order_lookup`` task (``workflows/order_lookup.py``), one durable
step each, checkpointed by DBOS in its system database:

1. ``read_order``  GET ``{sandbox}/orders/records/{order_id}`` with one keep-alive client per
   process; retried like the product's lookup (4 attempts, 2 s apart) on 5xx and transport errors,
   not on 404.
2. ``model_turn``  the scripted model: sleeps ``--latency-ms`` (a real model call's wait), then
   answers ``f"order {order_id} is {status}"``.
3. ``complete``    the outcome ``{"order_id", "order_status", "summary"}``, which the workflow returns.

Work is distributed through one DBOS queue, ``order_lookup``, with ``worker_concurrency`` = the
workflows in flight per process.

Modes
    worker   --db-url URL --sandbox-url URL --concurrency C --latency-ms L --index I
             launch DBOS (executor id ``worker-I``) and run the queue's workflows until SIGTERM/SIGINT.
    enqueue  --db-url URL --tasks N --concurrency C
             launch DBOS without listening to the queue (creates/migrates the system database),
             register the queue and enqueue workflows ``E-0`` ... ``E-{N-1}`` (workflow id = order id).

``--db-url`` may also come from ``DBOS_SYSTEM_DATABASE_URL``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from typing import Any

import httpx
from dbos import DBOS, DBOSConfig, SetWorkflowID

APP_NAME = "bench_peers_order_lookup"
APP_VERSION = "bench-1"  # fixed, so the enqueuer and every worker agree (DBOS only dequeues its version)
QUEUE_NAME = "order_lookup"
DEFAULT_POLLING_INTERVAL = 0.1  # DBOS's own default is 1.0 s; see README.md
HTTP_TIMEOUT = 10.0

# Per-process settings, fixed by main() before DBOS launches.
SETTINGS: dict[str, Any] = {"sandbox_url": "", "latency_ms": 0, "concurrency": 1}
_client: httpx.Client | None = None
_client_lock = threading.Lock()


def http() -> httpx.Client:
    """The process's one keep-alive HTTP client (httpx.Client is thread-safe), made on first use."""
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                size = max(int(SETTINGS["concurrency"]), 1)
                _client = httpx.Client(
                    timeout=HTTP_TIMEOUT,
                    # The sandbox answers only its token's bearers; the bench passes it in the environment.
                    headers={"Authorization": f"Bearer {os.environ.get('SANDBOX_TOKEN', '')}"},
                    limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                )
    return _client


def _transient(error: BaseException) -> bool:
    """Retry what the product's lookup retries: the orders system unavailable, not a missing order."""
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code >= 500
    return isinstance(error, httpx.TransportError)


@DBOS.step(
    name="read_order",
    retries_allowed=True,
    max_attempts=4,
    interval_seconds=2.0,
    backoff_rate=1.0,
    should_retry=_transient,
)
def read_order(order_id: str) -> dict[str, Any]:
    response = http().get(f"{SETTINGS['sandbox_url']}/orders/records/{order_id}")
    response.raise_for_status()
    record = response.json()
    return {"order_id": order_id, "order_status": record["data"].get("status"), "version": record["version"]}


@DBOS.step(name="model_turn")
def model_turn(facts: dict[str, Any]) -> str:
    if SETTINGS["latency_ms"]:
        time.sleep(SETTINGS["latency_ms"] / 1000)
    return f"order {facts.get('order_id')} is {facts.get('order_status', 'unknown')}"


@DBOS.step(name="complete")
def complete(facts: dict[str, Any], summary: str) -> dict[str, Any]:
    return {"order_id": facts["order_id"], "order_status": facts["order_status"], "summary": summary}


@DBOS.workflow(name="order_lookup")
def order_lookup(order_id: str) -> dict[str, Any]:
    facts = read_order(order_id)
    summary = model_turn(facts)
    return complete(facts, summary)


def pool_size(concurrency: int) -> int:
    """System database connections per process: one per workflow in flight, plus a few for the queue
    poller and DBOS's background work (DBOS's default is 20 whatever the concurrency)."""
    return max(concurrency + 4, 6)


def configure(db_url: str, *, executor_id: str, concurrency: int) -> None:
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": db_url,
        "application_version": APP_VERSION,
        "executor_id": executor_id,  # distinct per process: worker_concurrency and recovery go by it
        "sys_db_pool_size": pool_size(concurrency),
        "log_level": os.environ.get("DBOS_LOG_LEVEL", "WARNING"),
    }
    DBOS(config=config)


def register_queue(concurrency: int, polling_interval: float) -> None:
    DBOS.register_queue(
        QUEUE_NAME,
        worker_concurrency=concurrency,
        polling_interval_sec=polling_interval,
        on_conflict="always_update",
    )


def run_worker(args: argparse.Namespace) -> int:
    SETTINGS.update(
        sandbox_url=args.sandbox_url.rstrip("/"), latency_ms=args.latency_ms, concurrency=args.concurrency
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    configure(args.db_url, executor_id=f"worker-{args.index}", concurrency=args.concurrency)
    DBOS.listen_queues([QUEUE_NAME])
    DBOS.launch()
    register_queue(args.concurrency, args.polling_interval)
    print(f"worker-{args.index} (pid {os.getpid()}) ready", file=sys.stderr, flush=True)
    stop.wait()
    DBOS.destroy()
    if _client is not None:
        _client.close()
    return 0


def run_enqueue(args: argparse.Namespace) -> int:
    configure(args.db_url, executor_id="enqueuer", concurrency=1)
    DBOS.listen_queues([])  # this process only enqueues; it must not run any of them
    DBOS.launch()  # creates and migrates the system database
    register_queue(args.concurrency, args.polling_interval)
    queue = DBOS.retrieve_queue(QUEUE_NAME)
    assert queue is not None
    started = time.perf_counter()
    for i in range(args.tasks):
        with SetWorkflowID(f"E-{i}"):
            queue.enqueue(order_lookup, f"E-{i}")
    print(f"enqueued {args.tasks} workflows in {time.perf_counter() - started:.2f} s", file=sys.stderr)
    DBOS.destroy()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("mode", choices=("worker", "enqueue"))
    parser.add_argument("--db-url", default=os.environ.get("DBOS_SYSTEM_DATABASE_URL"),
                        help="the DBOS system database (postgresql://...)")  # fmt: skip
    parser.add_argument("--sandbox-url", default=os.environ.get("SANDBOX_BASE_URL", ""))
    parser.add_argument("--tasks", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=1, help="workflows in flight per worker process")
    parser.add_argument("--latency-ms", type=int, default=0, help="the scripted model's wait per turn")
    parser.add_argument("--polling-interval", type=float, default=DEFAULT_POLLING_INTERVAL,
                        help="seconds between two dequeue polls of a worker")  # fmt: skip
    parser.add_argument("--index", type=int, default=0, help="the worker's number (its executor id)")
    args = parser.parse_args(argv)
    if not args.db_url:
        parser.error("--db-url (or DBOS_SYSTEM_DATABASE_URL) is required")
    if args.mode == "worker" and not args.sandbox_url:
        parser.error("worker needs --sandbox-url")
    if args.concurrency < 1:
        parser.error("--concurrency must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_worker(args) if args.mode == "worker" else run_enqueue(args)


if __name__ == "__main__":
    sys.exit(main())
