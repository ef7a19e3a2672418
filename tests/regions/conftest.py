"""Real worker processes for the failover test: the crash tests' fixtures (sandbox over HTTP, workers)."""

from __future__ import annotations

from tests.chaos.conftest import sandbox, workers

__all__ = ["sandbox", "workers"]
