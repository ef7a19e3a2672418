from __future__ import annotations

from django.apps import AppConfig


class InteropConfig(AppConfig):
    name = "interop"
    verbose_name = "A2A interoperability"
