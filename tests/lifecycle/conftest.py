"""Real worker processes against the sandbox over HTTP (the crash suites' fixtures)."""

from __future__ import annotations

from tests.chaos.conftest import sandbox, workers

__all__ = ["sandbox", "workers"]
