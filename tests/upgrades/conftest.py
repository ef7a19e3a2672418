"""The crash tests' fixtures (the sandbox over HTTP, real worker processes), for the rollout test."""

from __future__ import annotations

from tests.chaos.conftest import sandbox, workers

__all__ = ["sandbox", "workers"]
