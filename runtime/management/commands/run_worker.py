"""manage.py run_worker: a worker that polls the database instead of a broker.

Each round (``runtime.loop``):

1. (with ``--sweep``) end overdue waits and expire late tasks of ``--region``, reconcile its unknown outcomes,
   every ``ALERT_SCAN_INTERVAL`` seconds raise and clear alerts (``runtime.alerts``), and every
   ``ROLLUP_INTERVAL`` seconds recount the tasks per tenant and state (``runtime.rollups``); expire
   approvals and lift key-scheme quarantines at beat's pace too (``Chores``);
   advance a queued bulk operation (``runtime.bulk``); and, in a thread of its own so a slow receiver
   never holds the tasks up, send the A2A push notifications due every ``A2A_PUSH_INTERVAL`` seconds
   (``runtime.pushes``; inline in the round on SQLite, which takes one writer at a time);
2. claim as many runnable tasks of ``--region`` as there are free slots
   (``--concurrency``, default ``WORKER_CONCURRENCY``) and run each in a slot
   thread until it waits or ends; sleep ``--idle`` seconds when nothing was done;
3. the database went away (restart, failover): never exit — reconnect with
   capped, jittered backoff (``runtime.reconnect``) and go on.

SIGTERM/SIGINT: drain — claim nothing more, let each slot stop at its next step
and give its lease back, exit within ``--drain`` seconds. ``--once`` runs one
round and waits for what it claimed. The Celery worker (``celery -A config
worker``) runs the same resume loop per doorbell.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from collections.abc import Callable
from datetime import timedelta
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from approvals import services as approvals
from config import metrics, otel
from runtime import alerts, bulk, db, pushes, reconcile, rollups, sweep
from runtime.loop import Loop
from runtime.workers import worker_id
from tasks import liveness


class Chores:
    """What a round does before claiming (``runtime.loop`` calls it at most every second).

    Every round: the sweep's waits, deadlines and parents (a retry's backoff ends within a second),
    the reconciler (an effect in doubt after a crash is settled as soon), bulk operations. At beat's
    pace (``CELERY_BEAT_SCHEDULE``), no faster: approvals expire every "expire-approvals" seconds,
    key-scheme quarantines are lifted every "sweep" seconds (``SWEEP_INTERVAL``), alerts and rollups
    every "alerts-scan" and "rollups" seconds. Those scans find nothing nearly always, and building
    and running their queries every second was a twentieth of a busy worker's Python time.
    """

    def __init__(self, worker: str, region: str, *, with_sweep: bool, push_inline: bool,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.worker, self.region, self.with_sweep, self.push_inline, self.clock = (
            worker, region, with_sweep, push_inline, clock
        )  # fmt: skip
        schedule = settings.CELERY_BEAT_SCHEDULE
        self.every = {
            "pushes": settings.A2A_PUSH_INTERVAL,
            "lift": schedule["sweep"]["schedule"],
            "approvals": schedule["expire-approvals"]["schedule"],
            "alerts": schedule["alerts-scan"]["schedule"],
            "rollups": schedule["rollups"]["schedule"],
        }
        self.due = dict.fromkeys(self.every, 0.0)  # each runs in the first round

    def _due(self, chore: str) -> bool:
        """Whether ``chore`` is due now; if so, it is next due a beat interval from now."""
        now = self.clock()
        if now < self.due[chore]:
            return False
        self.due[chore] = now + self.every[chore]
        return True

    def __call__(self) -> int:
        if self.push_inline and self._due("pushes"):
            pushes.send_due()
        if self.with_sweep:
            # This loop polls: no doorbell (ring=None skips the sweep's eligible-task query). Only this
            # worker's region: never another's tasks.
            sweep.sweep(None, region=self.region, lift_quarantines=self._due("lift"))
            reconcile.reconcile_unknown(region=self.region)
            if self._due("approvals"):
                approvals.expire_pending()
            if self._due("alerts"):
                alerts.scan()
            if self._due("rollups"):
                rollups.refresh()
        # Large bulk operations (runtime.bulk) advance a budget per round, so tasks are not starved.
        return bulk.run_pending(self.worker)


class Command(BaseCommand):
    help = "Run tasks of one region by polling PostgreSQL (no broker needed)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--region", default=settings.WORKER_REGION)
        parser.add_argument(
            "--concurrency", type=int, default=settings.WORKER_CONCURRENCY, help="tasks in flight at once"
        )
        parser.add_argument(
            "--db-connections",
            type=int,
            default=settings.WORKER_DB_CONNECTIONS,
            help="database connections the slots share (0: min(concurrency, 8) + 2)",
        )
        parser.add_argument(
            "--idle", type=float, default=0.5, help="seconds to sleep when nothing is runnable"
        )
        parser.add_argument("--lease-ttl", type=float, default=settings.LEASE_TTL_SECONDS)
        parser.add_argument(
            "--drain", type=float, default=30.0, help="seconds to let tasks in hand stop after SIGTERM"
        )
        parser.add_argument(
            "--sweep", dest="with_sweep", action="store_true", help="also end overdue waits (no beat running)"
        )
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--metrics-port", type=int, default=0, help="serve its metrics on 127.0.0.1:PORT")
        parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: never)")
        parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)  # the old name of --concurrency

    def handle(self, *args: Any, region: str, concurrency: int, db_connections: int, idle: float,
               lease_ttl: float, drain: float, with_sweep: bool, once: bool, max_seconds: float,
               batch: int | None, **options: Any) -> None:  # fmt: skip
        if batch is not None:  # the name this option had when a worker ran one task at a time
            concurrency = batch
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        stopping = False

        def stop(signum: int, frame: FrameType | None) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        pooled = db.use_pool(db_connections or min(concurrency, 8) + 2)
        if not pooled:
            concurrency = 1  # SQLite (the embedded demo) takes one writer at a time anyway
        otel.configure()
        if options.get("metrics_port"):  # its counters live in this process only (config/metrics.py)
            metrics.serve(options["metrics_port"])
        me, ttl = worker_id(), timedelta(seconds=lease_ttl)
        started = time.monotonic()

        def should_stop() -> bool:
            return stopping or bool(max_seconds and time.monotonic() - started > max_seconds)

        sender = pushes.PushSender(me, should_stop) if with_sweep and pooled else None
        chores = Chores(me, region, with_sweep=with_sweep, push_inline=with_sweep and sender is None)
        loop = Loop(me, region, concurrency, ttl, idle=idle, drain=drain, chores=chores)
        self.stdout.write(f"worker {me} region={region} concurrency={concurrency} lease={lease_ttl}s")
        if sender is not None:
            sender.start()
        try:
            drained = loop.run(should_stop=should_stop, once=once)
        finally:
            stopping = True  # the push sender too, when the loop ended by itself (--once, --max-seconds)
            if sender is not None:
                sender.join(settings.A2A_PUSH_TIMEOUT + 1)
            liveness.stop()
        if not drained:
            # Slots still waiting on the outside world: leave without them (their threads would hold
            # the interpreter's exit). The liveness lock is gone, so other workers take those tasks now.
            self.stdout.flush()
            os._exit(1)
