from __future__ import annotations

from django.apps import AppConfig


class RuntimeConfig(AppConfig):
    """What runs in a worker: the engine, the resume loop, the sweep, dispatch and reconciliation."""

    name = "runtime"
