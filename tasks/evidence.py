"""Reading evidence from authoritative systems over HTTP.

A workflow never keeps a copy of a record as truth: it keeps a reference
(system, record id, record version, when it was read) and the few facts it
accepted from it. Resume validation reads the record again and compares
versions, so old evidence is never silently handed back to the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from config import http
from config.external import connector_url


class EvidenceUnavailable(Exception):
    """The system did not answer usefully now (timeout, 5xx): try again later."""


class EvidenceMissing(Exception):
    """The system answered that the record does not exist."""


@dataclass(frozen=True)
class Record:
    system: str
    record_id: str
    version: str
    data: dict[str, Any]


def fetch(system: str, record_id: str, *, timeout: float | None = None) -> Record:
    url = f"{connector_url(system)}/records/{quote(record_id, safe='')}"
    try:
        response = http.client().get(url, timeout=timeout or settings.CONNECTOR_TIMEOUT)
    except httpx.HTTPError as exc:
        raise EvidenceUnavailable(f"{system}: {type(exc).__name__}: {exc}") from None
    if response.status_code == 404:
        raise EvidenceMissing(f"{system} has no record {record_id!r}")
    if response.status_code != 200:
        raise EvidenceUnavailable(f"{system} answered {response.status_code}")
    try:
        body = response.json()
        return Record(system, record_id, str(body["version"]), dict(body.get("data") or {}))
    except (ValueError, KeyError, TypeError) as exc:
        raise EvidenceUnavailable(f"{system} sent an unreadable record: {exc}") from None
