from __future__ import annotations

from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in


class ConsoleConfig(AppConfig):
    name = "console"

    def ready(self) -> None:
        from config.middleware import stamp_sign_in

        # A console session's idle and absolute limits count from sign-in (config/middleware.py).
        user_logged_in.connect(stamp_sign_in, dispatch_uid="config.middleware.stamp_sign_in")
