"""Where each external system lives: ``CONNECTOR_<NAME>_URL``, else the built-in sandbox."""

from __future__ import annotations

from django.conf import settings


def connector_url(name: str) -> str:
    return (settings.CONNECTOR_URLS.get(name) or f"{settings.SANDBOX_BASE_URL}/{name}").rstrip("/")
