"""Running the a2a-sdk's async client from a synchronous test.

``asyncio.run`` refuses to start in a thread whose event loop is running, and the browser tests'
Playwright (sync API, one browser per test process) leaves one running in the main thread: an A2A
test scheduled after a browser test on the same process failed with "asyncio.run() cannot be called
from a running event loop". Each call here runs its coroutine in a thread of its own; the ORM there
uses that thread's connection, closed when the thread is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import connection

T = TypeVar("T")


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    def in_its_own_thread() -> T:
        try:
            return asyncio.run(coroutine)
        finally:
            connection.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(in_its_own_thread).result()
