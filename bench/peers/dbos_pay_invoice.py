"""``pay_invoice`` written for DBOS Transact: the peer of ``make bench-cluster``'s failover run.

Runs in ``bench/peers/.venv`` only (``requirements.txt``); the product never imports it.
``bench/cluster.py --peer dbos`` starts it (enqueue, then workers) against a pg_auto_failover
formation and kills the primary under it.

The work mirrors the product's ``pay_invoice`` task (``workflows/pay_invoice.py``), one durable step
each, checkpointed by DBOS in its system database:

1. ``pay``       ``POST {sandbox}/payments/effects/`` with the charge, under the idempotency key
   ``dbos-{workflow id}/pay`` (DBOS's advice: the workflow id makes a step's retry the same request),
   so a payment sent again is answered with the first one. Retried on 5xx and transport errors
   (4 attempts, 2 s apart), as the product's dispatch is.
2. ``complete``  the outcome ``{"invoice_id", "amount", "payment_ref"}``, which the workflow returns.

Modes
    worker   --db-url URL --sandbox-url URL --concurrency C --index I
             launch DBOS (executor id ``worker-I``; at launch DBOS recovers the PENDING workflows of
             that executor id) and run the queue's workflows until SIGTERM/SIGINT.
    enqueue  --db-url URL --tasks N --concurrency C
             create DBOS's tables, register the queue and enqueue ``INV-HA-0000`` ... (workflow id =
             invoice id, amount 1.00 + n / 100 EUR).

``--db-url`` is a SQLAlchemy URL. SQLAlchemy does not parse libpq's multi-host form
(``postgresql://u@h1:p1,h2:p2/db``: "invalid literal for int()"); several hosts are written as
repeated ``host`` query parameters, ``postgresql://u@/db?host=h1:p1&host=h2:p2&target_session_attrs=
read-write``, which its psycopg dialect hands to libpq as ``host=h1,h2 port=p1,p2``.
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

APP_NAME = "bench_peers_pay_invoice"
APP_VERSION = "bench-1"  # fixed, so the enqueuer and every worker agree (DBOS only dequeues its version)
QUEUE_NAME = "pay_invoice"
HTTP_TIMEOUT = 10.0

SETTINGS: dict[str, Any] = {"sandbox_url": "", "concurrency": 1}
_client: httpx.Client | None = None
_client_lock = threading.Lock()


def invoice_id(n: int) -> str:
    return f"INV-HA-{n:04d}"


def http() -> httpx.Client:
    global _client
    if _client is None:
        with _client_lock:
            if _client is None:
                size = max(int(SETTINGS["concurrency"]), 1)
                _client = httpx.Client(
                    timeout=HTTP_TIMEOUT,
                    headers={"Authorization": f"Bearer {os.environ.get('SANDBOX_TOKEN', '')}"},
                    limits=httpx.Limits(max_connections=size, max_keepalive_connections=size),
                )
    return _client


def _transient(error: BaseException) -> bool:
    if isinstance(error, httpx.HTTPStatusError):
        return error.response.status_code >= 500
    return isinstance(error, httpx.TransportError)


@DBOS.step(
    name="pay", retries_allowed=True, max_attempts=4, interval_seconds=2.0, backoff_rate=1.0,
    should_retry=_transient,
)  # fmt: skip
def pay(invoice: str, amount: str) -> str:
    response = http().post(
        f"{SETTINGS['sandbox_url']}/payments/effects/",
        headers={"Idempotency-Key": f"dbos-{DBOS.workflow_id}/pay"},
        json={"kind": "charge", "invoice": invoice, "amount": amount, "currency": "EUR"},
    )
    response.raise_for_status()
    return str(response.json()["id"])


@DBOS.step(name="complete")
def complete(invoice: str, amount: str, payment_ref: str) -> dict[str, str]:
    return {"invoice_id": invoice, "amount": amount, "payment_ref": payment_ref}


@DBOS.workflow(name="pay_invoice")
def pay_invoice(invoice: str, amount: str) -> dict[str, str]:
    return complete(invoice, amount, pay(invoice, amount))


def configure(db_url: str, *, executor_id: str, concurrency: int) -> None:
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": db_url,
        "application_version": APP_VERSION,
        "executor_id": executor_id,
        "sys_db_pool_size": max(concurrency + 4, 6),
        "log_level": os.environ.get("DBOS_LOG_LEVEL", "WARNING"),
    }
    DBOS(config=config)


def register_queue(concurrency: int, polling_interval: float) -> None:
    DBOS.register_queue(
        QUEUE_NAME, worker_concurrency=concurrency, polling_interval_sec=polling_interval,
        on_conflict="always_update",
    )  # fmt: skip


def run_worker(args: argparse.Namespace) -> int:
    SETTINGS.update(sandbox_url=args.sandbox_url.rstrip("/"), concurrency=args.concurrency)
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
    return 0


def run_enqueue(args: argparse.Namespace) -> int:
    configure(args.db_url, executor_id="enqueuer", concurrency=1)
    DBOS.listen_queues([])
    DBOS.launch()
    register_queue(args.concurrency, args.polling_interval)
    queue = DBOS.retrieve_queue(QUEUE_NAME)
    assert queue is not None
    for n in range(args.tasks):
        with SetWorkflowID(invoice_id(n)):
            queue.enqueue(pay_invoice, invoice_id(n), f"{1 + n / 100:.2f}")
    DBOS.destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("mode", choices=("worker", "enqueue"))
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--sandbox-url", default="")
    parser.add_argument("--tasks", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--polling-interval", type=float, default=0.1)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.monotonic()
    code = run_worker(args) if args.mode == "worker" else run_enqueue(args)
    if args.mode == "enqueue":
        print(f"enqueued {args.tasks} in {time.monotonic() - started:.1f} s", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
