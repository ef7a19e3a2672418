"""One thread per worker process keeps every lease the process holds alive.

A task in flight may spend seconds in a model call or an outside system's
answer; its lease must not lapse meanwhile, and its own thread is busy
waiting. So the leases of all in-flight tasks are extended together, by one
UPDATE every ``ttl / 3`` (``tasks.leases.heartbeat_all``), from a thread of
their own. A lease found lost (taken over, or lapsed while this process was
paused) is marked, and the slot running it stops before its next step; its
commit would have been refused anyway, since every write carries the lease's
token and expiry in its own statement (``tasks.leases.fence``).

With the same beat it asks whether any of those tasks has an open cancel
request (one more query), and signals the slot running it.

The same thread checks the process's liveness connection (``tasks.liveness``)
and reopens it after a database restart; that round trip also measures the
process's clock against the database's, so a worker whose clock drifted past
``WORKER_MAX_CLOCK_SKEW`` stops claiming within a beat (the leases it holds run
on the database's clock whatever its own says).

It never dies: a beat the database refuses (lost, read-only, shut down) or
fails for a reason nobody classified is logged and counted by its SQLSTATE
(``runtime.reconnect.noted``), its connections and the pool's idle ones are
dropped (a session opened while the server was read-only stays read-only),
and it beats again at its own pace (``ttl / 3``: already slow enough not to
hammer a struggling server, and any slower would let live leases lapse).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from uuid import UUID

from django.db import connections

from runtime.reconnect import drop_connections, noted, server_gone
from tasks import cancellation, leases, liveness, metrics

log = logging.getLogger(__name__)


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass(frozen=True)
class CancelSignal:
    """What a beat sets for a task with open cancel requests."""

    # Read them before the next step. Set at the start: a request made while no worker held the task
    # is read by the worker that claims it, before its first step.
    asked: threading.Event = field(default_factory=_set_event)
    interrupt: threading.Event = field(default_factory=threading.Event)  # stop the model turn in flight

    def clear(self) -> None:
        self.asked.clear()
        self.interrupt.clear()


class Heartbeats:
    def __init__(self, ttl: timedelta, *, every: float | None = None):
        self.ttl = ttl
        self.every = every if every is not None else max(0.2, ttl.total_seconds() / 3)
        self._held: dict[UUID, leases.Held] = {}
        self._lost: set[leases.Held] = set()  # by token: a task claimed again is not lost with its old lease
        # Set when a beat finds an open cancel request for the task (``tasks.cancellation``): its slot
        # stops the model turn in flight (``runtime.llm.cancel_signal``) and reads the requests.
        self._signals: dict[UUID, CancelSignal] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- what the slots call ---------------------------------------------------------------------

    def hold(self, lease: leases.Held) -> CancelSignal:
        """Beat for ``lease`` from now on; return what a cancel request for its task sets."""
        with self._lock:
            self._held[lease.task_id] = lease
            signal = self._signals[lease.task_id] = CancelSignal()
            if lease.cancel_open is False:  # the claim read none open: no read before the first step (a
                signal.asked.clear()  # request made since is found by the next beat, as while held)
            return signal

    def drop(self, lease: leases.Held) -> None:
        with self._lock:
            if self._held.get(lease.task_id) == lease:
                del self._held[lease.task_id]
                self._signals.pop(lease.task_id, None)
            self._lost.discard(lease)

    def lost(self, lease: leases.Held) -> bool:
        """Whether the last beat found ``lease`` gone (no round trip)."""
        with self._lock:
            return lease in self._lost

    # --- the beating thread ----------------------------------------------------------------------

    def beat(self) -> set[UUID]:
        """Extend every held lease once; return the task ids found lost."""
        with self._lock:
            held = list(self._held.values())
        gone = leases.heartbeat_all(held, ttl=self.ttl)
        metrics.heartbeat(held, gone)  # durable_worker_heartbeats, durable_leases_lost
        if gone:
            with self._lock:
                # Only those still in hand: one released meanwhile was not lost, and is not kept.
                self._lost |= {h for h in held if h.task_id in gone and self._held.get(h.task_id) == h}
            log.warning("leases lost: %s", ", ".join(sorted(str(task_id) for task_id in gone)))
        asked = cancellation.pending_among(lease.task_id for lease in held)
        if asked:
            with self._lock:
                for task_id, scopes in asked.items():
                    signal = self._signals.get(task_id)
                    if signal is not None:
                        signal.asked.set()
                        if scopes & cancellation.INTERRUPTING:
                            signal.interrupt.set()
        return gone

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.every + 5)
            self._thread = None

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.every):
                try:
                    if not liveness.healthy():
                        liveness.ensure()
                    self.beat()
                except Exception as error:  # never let the beating thread die quietly
                    # Away or refusing: nothing to extend now; the slots find out on their own.
                    drop_connections(pool=server_gone(noted(error, where="heartbeat")))
        finally:
            connections.close_all()


_shared: tuple[int, Heartbeats] | None = None
_shared_lock = threading.Lock()


def shared(ttl: timedelta) -> Heartbeats:
    """This process's heartbeat thread for callers without a loop of their own (the Celery entry
    point, one doorbell per pool thread or process), started on first use; a forked child starts its own."""
    global _shared
    with _shared_lock:
        if _shared is None or _shared[0] != os.getpid():
            beats = Heartbeats(ttl)
            beats.start()
            _shared = (os.getpid(), beats)
        return _shared[1]
