from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks

from audit.keys import configuration_problems


def check_malformed_keys(**kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed AUDIT_HMAC_KEYS / AUDIT_ANCHOR_KEY stops every command, not just the first write."""
    _, malformed = configuration_problems()
    return [checks.Error(message, id="audit.E002") for message in malformed]


def check_missing_keys(**kwargs: Any) -> list[checks.CheckMessage]:
    """``check --deploy``: a deployment without its own audit keys cannot write or anchor the chain."""
    missing, _ = configuration_problems()
    return [checks.Error(message, id="audit.E001") for message in missing]


class AuditConfig(AppConfig):
    name = "audit"

    def ready(self) -> None:
        checks.register(check_malformed_keys, checks.Tags.security)
        checks.register(check_missing_keys, checks.Tags.security, deploy=True)
