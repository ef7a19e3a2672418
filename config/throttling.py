"""Throttles that hold under concurrency: one atomic increment per call in the shared cache.

DRF's ``SimpleRateThrottle`` reads a list of timestamps from the cache, decides, then writes the
list back: callers that arrive together all read the same list, all pass, and the last write wins.
So 16 threads sent 640 requests in 23 s against 600/min, and 300 wrong tokens drew no 429.

Here each call is counted by ``cache.incr`` on its window's counter, and the value that increment
returns decides: two callers can never both see the same count. The windows are fixed (the key
names the window, so a counter is never reset while it is in use) and weighted: a call is allowed
while ``previous window × the share of it still inside the last period + this window`` stays
within the rate, so the edge of a window is no burst of twice the rate. A refused call gives its
increment back, so a caller hammering at a 429 does not lock itself out for longer.

``cache.add`` + ``cache.incr`` are atomic on Django's memory cache (one process: the demo),
Redis and Memcached; ``config/settings.py`` refuses the cache backends where they are not (the
database and file caches read, add one and write back). Several web processes need one shared
Redis or Memcached (``CACHE_URL``), or each process counts for itself.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import cache
from rest_framework import throttling
from rest_framework.exceptions import Throttled


@dataclass(frozen=True)
class Take:
    """One call counted against a rate: allowed, or refused with the seconds until one would be."""

    allowed: bool
    counter: str
    retry_after: float | None = None


def take(key: str, limit: int, period: int, *, now: float | None = None) -> Take:
    """Count one call under ``key`` against ``limit`` calls per ``period`` seconds, atomically."""
    now = time.time() if now is None else now
    window = int(now // period)
    elapsed = now - window * period
    counter = f"{key}:{window}"
    count = _increment(counter, period)
    previous = int(cache.get(f"{key}:{window - 1}") or 0)
    overlap = previous * (1 - elapsed / period)  # the previous window's calls still within a period
    if overlap + count <= limit:
        return Take(True, counter)
    _decrement(counter)  # the refused call is not counted: only allowed calls use up the rate
    return Take(False, counter, _retry_after(limit, period, elapsed, previous, count - 1))


def give_back(taken: Take) -> None:
    """Uncount an allowed call (one that turned out not to be what the rate counts)."""
    if taken.allowed:
        _decrement(taken.counter)


def _increment(counter: str, period: int) -> int:
    # Created on the first miss. It outlives its window by one more, which reads it as
    # "previous"; so it never expires while it is counted, and no increment recreates it
    # without a timeout. Concurrent first calls both add (one wins) and both increment.
    for _ in range(3):
        try:
            return int(cache.incr(counter))
        except ValueError:  # not there yet, or culled (a full memory cache): start it
            cache.add(counter, 0, timeout=2 * period + 1)
    raise RuntimeError(f"the cache does not keep the throttle counter {counter!r}")


def _decrement(counter: str) -> None:
    with contextlib.suppress(ValueError):  # culled meanwhile: nothing left to give back
        cache.decr(counter)


def _retry_after(limit: int, period: int, elapsed: float, previous: int, current: int) -> float:
    """Seconds until ``overlap + current + 1 <= limit`` (in this window, or early in the next)."""
    room = limit - current - 1
    if previous > 0 and room >= 0:
        # overlap(t) = previous * (1 - t / period) falls to ``room`` at t = period * (1 - room / previous).
        at = period * (1 - room / previous)
        if at < period:
            return max(at - elapsed, 0.001)
    # In the next window this one is "previous": current * (1 - t / period) + 1 <= limit.
    upto = 0.0 if current == 0 else max(period * (1 - (limit - 1) / current), 0.0)
    return period - elapsed + upto


class AtomicRateThrottle(throttling.SimpleRateThrottle):
    """``SimpleRateThrottle`` (rates, scopes, cache keys, ``Retry-After``) counted by ``take``."""

    num_requests: int  # set from the rate by SimpleRateThrottle.__init__
    duration: int
    taken: Take | None = None

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        self.taken = take(self.key, self.num_requests, self.duration)
        return self.taken.allowed

    def wait(self) -> float | None:
        if self.taken is None or self.taken.retry_after is None:
            return None
        return float(math.ceil(self.taken.retry_after))


class AnonRateThrottle(AtomicRateThrottle, throttling.AnonRateThrottle):
    """Per address for callers with no credentials (``API_THROTTLE_ANON``)."""


class UserRateThrottle(AtomicRateThrottle, throttling.UserRateThrottle):
    """Per user for signed-in callers and tokens (``API_THROTTLE_USER``)."""


class WrongTokenThrottle(AtomicRateThrottle):
    """Wrong keys per client address, at the anonymous rate (``API_THROTTLE_ANON``), one count for every
    surface that takes API tokens (the REST APIs ``api.auth``, A2As ``a2a_api.views``).

    Every key is counted before it is looked up and a right one is given back: counting only
    after a lookup failed would let concurrent guesses all pass the check first.
    """

    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": "wrong_token", "ident": self.get_ident(request)}

    def count_attempt(self, request: Any) -> None:
        """429 when this address used up its wrong keys; else this key counts until ``right_key``."""
        if not self.allow_request(request, None):
            raise Throttled(wait=self.wait())

    def right_key(self) -> None:
        if self.taken is not None:
            give_back(self.taken)
