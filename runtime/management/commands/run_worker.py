"""manage.py run_worker: a worker that polls the database instead of a broker.

1. (with ``--sweep``) end overdue waits, expire late tasks, reconcile unknown outcomes;
2. claim up to ``--batch`` runnable tasks of ``--region`` without a live lease;
3. run each until it waits or ends, then advance a queued bulk operation (``runtime.bulk``);
   sleep ``--idle`` seconds when nothing was done;
4. the database went away (restart, failover: the round raised a connection
   error): never exit — reconnect with capped, jittered backoff, give back the
   leases held when it broke (``runtime.reconnect``), and go on with step 1.
SIGTERM/SIGINT: finish the task in hand, then exit. ``--once`` runs one round.
The Celery worker (``celery -A config worker``) runs the same resume loop per doorbell.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand

from approvals import services as approvals
from config import otel
from runtime import bulk, reconcile, reconnect, runner, sweep
from runtime.workers import worker_id


class Command(BaseCommand):
    help = "Run tasks of one region by polling PostgreSQL (no broker needed)."

    def add_arguments(self, parser):
        parser.add_argument("--region", default=settings.WORKER_REGION)
        parser.add_argument("--batch", type=int, default=10)
        parser.add_argument(
            "--idle", type=float, default=0.5, help="seconds to sleep when nothing is runnable"
        )
        parser.add_argument("--lease-ttl", type=float, default=settings.LEASE_TTL_SECONDS)
        parser.add_argument(
            "--sweep", dest="with_sweep", action="store_true", help="also end overdue waits (no beat running)"
        )
        parser.add_argument("--once", action="store_true")
        parser.add_argument("--max-seconds", type=float, default=0, help="stop after this long (0: never)")

    def handle(self, *args, region, batch, idle, lease_ttl, with_sweep, once, max_seconds, **options):
        stopping = False

        def stop(signum, frame):
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        otel.configure()
        me, ttl = worker_id(), timedelta(seconds=lease_ttl)
        started = time.monotonic()
        self.stdout.write(f"worker {me} region={region} lease={lease_ttl}s")

        def should_stop() -> bool:
            return stopping or bool(max_seconds and time.monotonic() - started > max_seconds)

        while not stopping:
            try:
                ran = self.round(me, region=region, batch=batch, ttl=ttl, with_sweep=with_sweep)
            except reconnect.CONNECTION_LOST as error:
                if not reconnect.recover(me, error, stopping=should_stop):
                    break
                continue  # the database is back: run a round at once
            if once or should_stop():
                break
            if not ran:
                time.sleep(idle)

    def round(self, me: str, *, region: str, batch: int, ttl: timedelta, with_sweep: bool) -> int:
        """Steps 1-3 once; return how many tasks ran."""
        if with_sweep:
            sweep.sweep(lambda task_id, task_region: None)  # this loop polls; no doorbell needed
            reconcile.reconcile_unknown()
            approvals.expire_pending()
        ran = runner.run_available(worker_id=me, region=region, limit=batch, ttl=ttl)
        # Large bulk operations (runtime.bulk) advance a budget per round, so tasks are not starved.
        return ran + bulk.run_pending(me)
