"""Imported at start-up by a worker run under libfaketime (on its ``PYTHONPATH``: test_clock_skew.py).

libfaketime 0.9.10 with ``FAKETIME_DONT_FAKE_MONOTONIC=1`` (the worker's timers
kept real, its wall clock shifted) turns the absolute ``clock_nanosleep`` under
Python's ``time.sleep`` into ``EINVAL``; a condition wait (what
``threading.Event.wait`` uses) is unaffected. So sleeps wait on an event here:
the same pause, the worker's code unchanged.
"""

from __future__ import annotations

import threading
import time


def _sleep(seconds: float) -> None:
    threading.Event().wait(seconds)


time.sleep = _sleep
