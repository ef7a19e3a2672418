from __future__ import annotations

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    name = "tenancy"

    def ready(self) -> None:
        from tenancy import receivers

        receivers.connect()
