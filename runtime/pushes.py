"""A worker's A2A push sender: ``interop.push.deliver_due`` every ``A2A_PUSH_INTERVAL`` seconds.

``run_worker --sweep`` runs it in a thread of its own (``PushSender``), beside the claim loop: a POST
may wait ``A2A_PUSH_TIMEOUT`` seconds on a slow receiver, and the tasks must not wait with it. The
Celery deployment runs the same call from beat (``interop.push_deliver`` in ``runtime.workers``).

Any number of processes may send at once (each delivery is leased, ``interop.push``), and a process
killed at any point loses nothing: the outbox is the transition log. The loop

1. enqueues and sends what is due, again at once while a full batch went out;
2. otherwise waits ``A2A_PUSH_INTERVAL`` seconds (or until told to stop);
3. on a database error, logs and counts it, backs off until PostgreSQL answers (``runtime.reconnect``),
   and goes on: it never exits but when the worker stops. The thread's connection goes back to the
   pool after each round, so it holds no session while it waits.
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


def send_due() -> int:
    """One round: enqueue new status changes, send what is due; how many were delivered."""
    return push.deliver_due(limit=BATCH)


class PushSender:
    """The thread that runs ``send_due`` until ``should_stop()`` (module docstring)."""

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
        trouble = reconnect.Backoff()
        while not self.should_stop():
            busy = False
            try:
                busy = send_due() >= BATCH
                trouble.attempt = 0
            except Exception as error:  # never exits: the database comes back, the receivers too
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
            finally:
                connections["default"].close()  # back to the pool while this thread waits
            if not busy:
                self._wait()

    def _wait(self) -> None:
        waited = 0.0
        while waited < self.interval and not self.should_stop():
            step = min(0.1, self.interval - waited)
            time.sleep(step)
            waited += step
