"""Checkpoints written by code other than the running code, for tests of what it cannot read.

The helper moved to ``demo.foreign`` so ``seed_demo`` writes its foreign checkpoints the
same way; this module keeps the tests' import path.
"""

from __future__ import annotations

from demo.foreign import written_as

__all__ = ["written_as"]
