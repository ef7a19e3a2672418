from __future__ import annotations

from django.apps import AppConfig


class InteropConfig(AppConfig):
    name = "interop"
    verbose_name = "A2A interoperability"

    def ready(self) -> None:
        from audit import sealing  # an app's models and their registration load once the registry is ready

        # The push configs' sealed token and credentials, re-sealed by ``manage.py rotate_keys``.
        sealing.register_json_column("push configs", self.get_model("PushConfig"), "secrets")
