"""Data protection: the policies over the kernel's rows that decide how long data lives and who sees it.

Retention (archive, delete, legal holds), revealing a masked field, and key rotation. The
models they act on stay the kernel's (``tasks.models``: ``RetentionPolicy``, ``LegalHold``,
``Archive``), as does the cipher they write through (``audit.sealing``); this app holds only the
logic above them, which the kernel never imports.
"""

from __future__ import annotations

from django.apps import AppConfig


class ProtectionConfig(AppConfig):
    name = "protection"
    label = "protection"
    verbose_name = "Data protection"
