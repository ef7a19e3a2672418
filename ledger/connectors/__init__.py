"""Connectors to the systems that hold the truth about side effects.

A connector is one class; which class serves which name is one setting
(``LEDGER_CONNECTORS``). Every connector offers ``dispatch(key, effect)`` and
``lookup(key)``, and may offer ``describe()``. Evidence is read with
``read(record_id)``; a connector that only sends effects refuses it with
``ReadNotSupported`` (``ledger.connectors.base``).
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from ledger.connectors.base import Connector


@cache
def get(name: str) -> Connector:
    try:
        path = settings.LEDGER_CONNECTORS[name]
    except KeyError:
        raise LookupError(f"no connector named {name!r} (LEDGER_CONNECTORS)") from None
    connector: Connector = import_string(path)(name)
    return connector


def names() -> list[str]:
    return sorted(settings.LEDGER_CONNECTORS)
