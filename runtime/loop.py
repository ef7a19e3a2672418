"""The worker loop: up to ``concurrency`` tasks in flight in one process, each in a thread of its own.

Why threads: a task's step spends its time waiting — on the model, on an
outside system, on PostgreSQL — and the whole runtime (the Django ORM, the
transition primitive, the connectors) is synchronous code that is already
safe per thread (a connection per thread, a shared HTTP client). Threads
give many tasks in flight without a second, async copy of that code; the
GIL is released while each thread waits, which is all of the time that
matters here. The database connections are bounded separately: a slot holds
one only while it talks to PostgreSQL (``runtime.db.released`` around each
wait on the outside), from a pool sized by ``WORKER_DB_CONNECTIONS``.

The main thread claims as many runnable tasks as there are free slots, in one
claim (``tasks.leases.claim_next``), hands each to a slot, and waits for a
slot to free up (or ``idle`` seconds when nothing was runnable). One thread
(``runtime.heartbeats``) extends every in-flight lease together.

A database that goes away or refuses (read-only after a failover, a shutdown,
recovery in progress) and any database error nobody classified: never an
exit, nor a slot thread ending quietly. The main thread, each slot and the
heartbeat thread log and count it, drop their connections and the pool's idle
ones, back off and go on (``runtime.reconnect``); a slot first gives its task's
lease back once the database takes writes, so the task is claimed anew.

Draining (SIGTERM): no new claims; each slot stops at its next step boundary
and gives its lease back, so another worker resumes the task at once; after
``drain`` seconds the process exits with whatever is still in hand — its
liveness lock goes with it (``tasks.liveness``), so those tasks are free at once too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import timedelta

import structlog
from django.db import connections

from runtime import reconnect, runner
from runtime.heartbeats import Heartbeats
from tasks import leases, liveness

log = logging.getLogger(__name__)


@dataclass
class Loop:
    worker_id: str
    region: str
    concurrency: int
    ttl: timedelta
    idle: float = 0.5
    drain: float = 30.0
    # Called before claiming, at most every ``chore_every`` seconds (the sweep, bulk operations);
    # returns work done. Slots free up many times a second under load: the chores need not follow.
    chores: Callable[[], int] = lambda: 0
    chore_every: float = 1.0
    draining: threading.Event = field(default_factory=threading.Event)

    def run(self, *, should_stop: Callable[[], bool], once: bool = False) -> bool:
        """Loop until ``should_stop()``; False if tasks were still in hand after ``drain`` seconds."""
        try:
            liveness.ensure()
        except Exception as error:  # the database is away: the heartbeat thread takes it later
            reconnect.noted(error, where="claim")
            log.warning("no liveness lock yet: the database is not answering")
        beats = Heartbeats(self.ttl)
        beats.start()
        in_flight: set[Future[str]] = set()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="slot")
        chores_due = 0.0
        trouble = reconnect.Backoff()  # grows over consecutive failed rounds, reset by a clean one
        try:
            while not should_stop():
                try:
                    done = 0
                    # A worker whose clock is off claims nothing (tasks.liveness): nor does it sweep,
                    # expire waits or scan for alerts by that clock.
                    if time.monotonic() >= chores_due and liveness.claims_refused() is None:
                        done = self.chores()
                        chores_due = time.monotonic() + (0.0 if done else self.chore_every)
                    free = self.concurrency - len(in_flight)
                    # Claim in batches: one claim costs about what a step does, so claiming each time a
                    # single slot frees up would double the work under load. Idle, claim whatever is free.
                    enough = free >= max(1, self.concurrency // 4) or not in_flight
                    claimed = self._claim(free) if free > 0 and enough else []
                    trouble.attempt = 0
                except Exception as error:  # lost, refused or unclassified: never an exit
                    if not reconnect.recover(
                        self.worker_id, error, stopping=should_stop, release=False, backoff=trouble
                    ):
                        break
                    continue  # the heartbeat thread retakes the liveness lock if it went with the database
                for lease in claimed:
                    in_flight.add(pool.submit(self._slot, lease, beats))
                if once:  # one round: what it claimed runs to its end, as without --once
                    self._reap(wait(in_flight).done)
                    in_flight = set()
                    break
                if in_flight and (not claimed or len(in_flight) >= self.concurrency):
                    finished, in_flight = wait(in_flight, timeout=self.idle, return_when=FIRST_COMPLETED)
                    self._reap(finished)
                elif not claimed and not done:
                    time.sleep(self.idle)
                finished = {f for f in in_flight if f.done()}
                in_flight -= finished
                self._reap(finished)
        finally:
            self.draining.set()
            _, unfinished = wait(in_flight, timeout=self.drain)
            if unfinished:
                log.warning("exiting with %d task(s) still in hand; their leases lapse with this process",
                            len(unfinished))  # fmt: skip
            pool.shutdown(wait=not unfinished, cancel_futures=True)
            beats.stop()
        return not unfinished

    def _claim(self, free: int) -> list[leases.Held]:
        return leases.claim_next(worker_id=self.worker_id, region=self.region, limit=free, ttl=self.ttl)

    def _slot(self, lease: leases.Held, beats: Heartbeats) -> str:
        """Run one claimed task in this slot's thread; a lost database is waited out here, for it only."""
        # A pool thread's log context outlives the work it ran: this slot's lines name its task only.
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(task_id=str(lease.task_id), worker_id=self.worker_id)
        try:
            return runner.run_task(
                lease.task_id, worker_id=self.worker_id, region=self.region, ttl=self.ttl,
                held=lease, heartbeats=beats, stopping=self.draining.is_set,
            )  # fmt: skip
        except Exception as error:  # lost, refused or unclassified: the slot lives on
            beats.drop(lease)
            if not reconnect.recover(
                self.worker_id, error, task_id=lease.task_id, stopping=self.draining.is_set,
                give_up_after=self.ttl.total_seconds(), where="slot",
            ):  # fmt: skip
                return "database_unavailable"
            return "lease_released"  # recover gave it back: any worker (this one too) claims it anew
        finally:
            connections.close_all()  # back to the pool (or closed): a slot keeps no connection between tasks
            structlog.contextvars.clear_contextvars()

    def _reap(self, finished: set[Future[str]]) -> None:
        for future in finished:
            error = future.exception()
            if error is not None:
                log.error("a slot failed", exc_info=error)
