"""Reading evidence from authoritative systems, through their connectors (``ledger.connectors``).

A workflow never keeps a copy of a record as truth: it keeps a reference
(system, record id, record version, when it was read) and the few facts it
accepted from it. Resume validation reads the record again and compares
versions, so old evidence is never silently handed back to the model.

A record is outside data: its version and every field a step accepts as a
fact must be storable (``tasks.values``). One that is not — an order whose
status holds a NUL — cannot be trusted as evidence, and asking again will not
change it; the step quarantines the task naming the system, record and field
(``EvidenceUnstorable``) so an operator can have the record fixed and release it.

Reads are tenant-scoped: a record that names its owner (field ``OWNER_FIELD``, the tenant's slug)
is evidence only for that tenant's tasks; read for any other it is ``EvidenceMissing``, worded as
for a record that does not exist, so a task learns nothing of another tenant's records (not even
that the id is taken). A record naming no owner is shared reference data, readable by every tenant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from audit.redaction import redact
from ledger import connectors
from ledger.connectors.base import ReadUnavailable
from runtime import db
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


# The record field naming the tenant (its slug) a record belongs to.
OWNER_FIELD = "tenant"


def fetch(system: str, record_id: str, *, tenant: str) -> Record:
    """Read one record through the ``system``'s connector for a task of ``tenant`` (a slug).
    Raises ``EvidenceUnavailable`` (try later), ``EvidenceMissing`` (no such record, or one
    another tenant owns) or ``EvidenceUnstorable`` (its version cannot be stored). A system with
    no connector (``LookupError``) or one whose connector cannot read (``ReadNotSupported``) is a
    deployment mistake, not evidence: those propagate."""
    try:
        with db.released():  # no database session held while the system answers
            found = connectors.get(system).read(record_id)
    except ReadUnavailable as exc:
        # The connector's message names the system; it may quote what the system sent (redacted:
        # it becomes the task's audit reason).
        raise EvidenceUnavailable(values.printable(redact(str(exc)))) from None
    owner = found.data.get(OWNER_FIELD) if found is not None and isinstance(found.data, dict) else None
    if found is None or (owner not in (None, "") and str(owner) != tenant):
        raise EvidenceMissing(f"{system} has no record {record_id!r}")
    record = Record(system, record_id, found.version, found.data)
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
