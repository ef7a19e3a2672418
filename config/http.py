"""One HTTP client per process for talking to external systems.

Building an ``httpx.Client`` per call costs tens of milliseconds of CPU (a TLS
context each time); a shared, lazily built client keeps connections and that
setup across calls. httpx clients are thread-safe; each process (including
each forked worker) builds its own on first use.
"""

from __future__ import annotations

import os
import threading

import httpx

_lock = threading.Lock()
_client: httpx.Client | None = None
_pid: int | None = None


def client() -> httpx.Client:
    global _client, _pid
    if _client is None or _pid != os.getpid():
        with _lock:
            if _client is None or _pid != os.getpid():
                _client, _pid = httpx.Client(), os.getpid()
    return _client
