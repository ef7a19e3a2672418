"""A worker's A2A push sender: ``interop.push.Pipeline`` run continuously in a thread of its own.

``run_worker --sweep`` runs it (``PushSender``) beside the claim loop: a POST may wait
``A2A_PUSH_TIMEOUT`` seconds on a slow receiver, and the tasks must not wait with it. The Celery
deployment runs ``send_due`` (``interop.push.deliver_due``) from beat every ``A2A_PUSH_INTERVAL``
seconds (``interop.push_deliver`` in ``runtime.workers``).

Any number of processes may send at once (each delivery is leased, ``interop.push``), and a process
killed at any point loses nothing: the outbox is the transition log. The loop

1. enqueues the status changes committed since it last looked (at most every ``BUSY_POLL`` seconds),
   claims what is due for its free slots and starts those POSTs (``PARALLEL`` at once, one per config),
   and records the POSTs that finished, waiting at most ``BUSY_POLL`` seconds for one;
2. while it has found work within the last ``A2A_PUSH_INTERVAL`` seconds it goes on like that, so a
   change committed under load is queued within ``BUSY_POLL`` seconds, not at the next round; a
   sender with nothing to do for a whole interval looks again every ``A2A_PUSH_INTERVAL`` seconds
   (its connection back in the pool meanwhile);
3. on a database error, logs and counts it, backs off until PostgreSQL answers (``runtime.reconnect``),
   and goes on: it never exits but when the worker stops (the POSTs in flight are recorded first).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import connections

from interop import push
from runtime import reconnect

log = logging.getLogger(__name__)
BATCH = 100
BUSY_POLL = 0.2  # seconds: how soon a busy sender looks for new changes and finished POSTs


def send_due() -> int:
    """One round: enqueue new status changes, send what is due; how many were delivered."""
    return push.deliver_due(limit=BATCH)


class PushSender:
    """The thread that runs a ``push.Pipeline`` until ``should_stop()`` (module docstring)."""

    def __init__(self, worker_id: str, should_stop: Callable[[], bool], interval: float | None = None):
        self.worker_id = worker_id
        self.should_stop = should_stop
        self.interval = settings.A2A_PUSH_INTERVAL if interval is None else interval
        self.thread = threading.Thread(target=self.run, name="push-sender", daemon=True)

    def start(self) -> PushSender:
        self.thread.start()
        return self

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def run(self) -> None:
        pipeline = push.Pipeline(enqueue_every=min(BUSY_POLL, self.interval))
        try:
            self._loop(pipeline)
        finally:
            try:
                pipeline.collect(timeout=None)  # what was sent is recorded, not sent again
            except Exception:  # the database is gone: the leases run out, others send again
                log.exception("push outcomes not recorded at stop")
            pipeline.close()
            connections["default"].close()

    def _loop(self, pipeline: push.Pipeline) -> None:
        trouble = reconnect.Backoff()
        worked_at = float("-inf")
        while not self.should_stop():
            try:
                started = pipeline.step()
                pipeline.collect(timeout=BUSY_POLL if pipeline.busy() else 0)
                trouble.attempt = 0
            except Exception as error:  # never exits: the database comes back, the receivers too
                connections["default"].close()
                if not reconnect.recover(
                    self.worker_id,
                    error,
                    stopping=self.should_stop,
                    release=False,
                    where="push",
                    backoff=trouble,
                ):
                    return
                continue
            now = time.monotonic()
            if started or pipeline.busy():
                worked_at = now
                continue
            if now - worked_at < self.interval:
                self._wait(BUSY_POLL)  # lately busy: more is likely to come soon
            else:
                connections["default"].close()  # back to the pool while this thread waits
                self._wait(self.interval)

    def _wait(self, seconds: float) -> None:
        waited = 0.0
        while waited < seconds and not self.should_stop():
            step = min(0.1, seconds - waited)
            time.sleep(step)
            waited += step
