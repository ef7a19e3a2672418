from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo: seed_demo, run_demo and the simulated external systems (``demo.sandbox``)."""

    name = "demo"
