"""Reading evidence from authoritative systems over HTTP.

A workflow never keeps a copy of a record as truth: it keeps a reference
(system, record id, record version, when it was read) and the few facts it
accepted from it. Resume validation reads the record again and compares
versions, so old evidence is never silently handed back to the model.

A record is outside data: its version and every field a step accepts as a
fact must be storable (``tasks.values``). One that is not — an order whose
status holds a NUL — cannot be trusted as evidence, and asking again will not
change it; the step quarantines the task naming the system, record and field
(``EvidenceUnstorable``) so an operator can have the record fixed and release it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from config import http
from config.external import connector_url
from tasks import values
from tasks.checkpoints import Scalar, as_fact


class EvidenceUnavailable(Exception):
    """The system did not answer usefully now (timeout, 5xx): try again later."""


class EvidenceMissing(Exception):
    """The system answered that the record does not exist."""


class EvidenceUnstorable(Exception):
    """The record holds a value no column can keep: the task cannot trust it as evidence."""

    def __init__(self, system: str, record_id: str, field: str, problem: str) -> None:
        record = values.printable(record_id, values.MAX_QUOTED)
        super().__init__(f"{system} record '{record}': field '{field}' {problem}")
        self.system, self.record_id, self.field, self.problem = system, record_id, field, problem


@dataclass(frozen=True)
class Record:
    system: str
    record_id: str
    version: str
    data: dict[str, Any]


def fetch(system: str, record_id: str, *, timeout: float | None = None) -> Record:
    """Read one record. Raises ``EvidenceUnavailable`` (try later), ``EvidenceMissing``
    (no such record) or ``EvidenceUnstorable`` (its version cannot be stored)."""
    url = f"{connector_url(system)}/records/{quote(record_id, safe='')}"
    try:
        response = http.client().get(url, timeout=timeout or settings.CONNECTOR_TIMEOUT)
    except httpx.HTTPError as exc:
        raise EvidenceUnavailable(values.printable(f"{system}: {type(exc).__name__}: {exc}")) from None
    if response.status_code == 404:
        raise EvidenceMissing(f"{system} has no record {record_id!r}")
    if response.status_code != 200:
        raise EvidenceUnavailable(f"{system} answered {response.status_code}")
    try:
        body = response.json()
        record = Record(system, record_id, str(body["version"]), dict(body.get("data") or {}))
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise EvidenceUnavailable(values.printable(f"{system} sent an unreadable record: {exc}")) from None
    # The version is kept in the checkpoint and quoted in resume validation's reasons.
    problem = values.text_problem(record.version)
    if problem:
        raise EvidenceUnstorable(system, record_id, "version", problem)
    return record


def facts_from(record: Record, fields: Mapping[str, str]) -> dict[str, Scalar]:
    """The record's ``fields`` (record field -> fact name) as accepted facts.

    Raises ``EvidenceUnstorable`` naming the first field whose value cannot be stored.
    """
    accepted: dict[str, Scalar] = {}
    for name, fact in fields.items():
        try:
            accepted[fact] = as_fact(record.data.get(name))
        except values.Unstorable as exc:
            raise EvidenceUnstorable(record.system, record.record_id, name, exc.problem) from None
    return accepted
