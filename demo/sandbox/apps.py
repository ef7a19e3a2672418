from __future__ import annotations

from django.apps import AppConfig


class SandboxConfig(AppConfig):
    name = "demo.sandbox"
    label = "sandbox"  # the label its tables and migrations were created under
