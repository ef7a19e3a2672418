from __future__ import annotations

from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo: seed_demo, run_demo and the simulated external systems (``demo.sandbox``)."""

    name = "demo"

    def ready(self) -> None:
        from console import sign_in
        from demo.users import login_hint

        sign_in.register(login_hint)
