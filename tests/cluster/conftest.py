"""The crash tests' fixtures: the sandbox over HTTP (the payment system whose records survive ours)."""

from __future__ import annotations

from tests.chaos.conftest import sandbox

__all__ = ["sandbox"]
