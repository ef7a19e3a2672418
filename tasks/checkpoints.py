"""The checkpoint contract: a typed, versioned application record.

A checkpoint says where a task stands in terms the application owns — never a
pickled object or a framework's memory dump — so any later deployment can read
it, migrate it through a chain of pure functions, or refuse it with a precise,
machine-readable reason (which quarantines the task — except a newer schema,
which is left to the newer deployment that wrote it).

Encoding: canonical JSON in format ``audit.canonical.V1_ASCII`` (sorted keys,
no whitespace, non-ASCII escaped: the body is ASCII) under the codec name
``json/v1``. ``CURRENT_SCHEMA`` is the only version the code writes.

Versions and rollouts: ``Checkpoint`` names the current contract in one line, and
``CURRENT_SCHEMA`` follows from it; ``MIGRATIONS`` is the chain from older
versions and ``READABLE`` what this code can load. An older deployment differs
from a newer one by that line, so both can run against one database at once:
workers claim only tasks whose newest checkpoint is at most their
``CURRENT_SCHEMA`` (``Task.checkpoint_schema``), one that meets a newer
checkpoint anyway leaves the task untouched, and a newer one that migrates an
older checkpoint says so in the audit log (``checkpoint_migrated``) and
revalidates before resuming.

Integrity: every stored body carries its SHA-256 ``digest``, and the audit event
of the transition that wrote it records the same digest inside its chain hash.
``decode_stored`` checks size, codec and digest before parsing a byte, and the
``schema_version`` column against the body after, so a body edited outside the
application is refused (and its task quarantined), never resumed from.

Sealed facts: the facts a task type marks sensitive are stored as envelopes
(``audit.sealing``), each bound to its task, version and field. The digest is
taken over the body with each envelope's key id and token blanked
(``sealing.blank``), and only that: rotating keys rewrites a body in place
(``manage.py rotate_keys``) without changing the digest its audit event holds,
so the chain stays verifiable across rotations. The token is not left unguarded
by this — Fernet authenticates it and the place sealed inside it must be where
it is found — but it is guarded by the key rather than by the chain. Decoding
opens every envelope; one that cannot be opened (its key retired, the token
altered, or moved from another row or field) is ``checkpoint_undecryptable``,
naming the field and the key id, never the value. A body without envelopes
(written before sealing, or of a type with nothing sensitive) digests exactly
as before: SHA-256 of the body as stored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from audit import canonical, sealing
from tasks import metrics, values
from tasks.states import State

CODEC = "json/v1"

Scalar = str | int | float | bool | None
MAX_FACT_LENGTH = 2000


def as_fact(value: Any) -> Scalar:
    """An outside value (a record field, an event payload) as an accepted fact: a scalar, text bounded.

    Raises ``values.Unstorable`` for a value no column can hold (a NUL, a lone
    surrogate, NaN): the caller decides what refusing it means for its source.
    A non-scalar becomes its ``repr``, which escapes such characters itself.
    """
    fact = value if value is None or isinstance(value, bool | int | float) else str(value)[:MAX_FACT_LENGTH]
    values.check(fact, "")
    return fact


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EvidenceRef(_Strict):
    """A pointer to an authoritative record, with the version that was read."""

    system: str
    record_id: str
    record_version: str
    fetched_at: datetime


class ToolCallRecord(_Strict):
    """A completed call with a side effect, by its ledger identity."""

    action_id: str
    idempotency_key: str
    step: str
    outcome: str


class PendingAction(_Strict):
    idempotency_key: str
    step: str
    connector: str
    effect_digest: str


class ApprovalRef(_Strict):
    request_id: str
    digest: str
    status: str


class RuntimeConfig(_Strict):
    model: str = ""
    prompt: str = ""
    tool_set: str = ""


class Progress(_Strict):
    """The part of a checkpoint the workflow decides: where it is and what it knows.

    The transition primitive adds the authoritative part (task id, state,
    version, policy, runtime config, attempt, timestamps) from the task row,
    so the two can never disagree.
    """

    step: str = Field(description="Position in the task type's workflow")
    input_refs: list[str] = Field(default_factory=list)
    output_refs: list[str] = Field(default_factory=list)
    # Facts the workflow accepted so far (answers, looked-up values); scalars only,
    # so transient model context cannot sneak in as a blob.
    facts: dict[str, Scalar] = Field(default_factory=dict)
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    approvals: list[ApprovalRef] = Field(default_factory=list)
    evidence: list[EvidenceRef] = Field(default_factory=list)


class CheckpointV2(Progress):
    schema_version: Literal[2] = 2
    # The deployment that wrote this checkpoint; a worker of another deployment
    # revalidates before resuming from it ("" = written before this was recorded).
    deployment: str = ""
    task_id: UUID
    state: State
    state_version: int = Field(ge=1)
    pending_actions: list[PendingAction] = Field(default_factory=list)
    policy_version: str
    runtime_config: RuntimeConfig = Field(default_factory=RuntimeConfig)
    trace_link: str = ""
    attempt: int = Field(default=0, ge=0)
    created_at: datetime
    state_entered_at: datetime
    wait_deadline: datetime | None = None
    deadline: datetime | None = None

    @property
    def progress(self) -> Progress:
        return Progress.model_validate(self.model_dump(include=set(Progress.model_fields)))

    @property
    def migrated_from(self) -> int | None:
        """The schema version this checkpoint was stored at when ``decode`` migrated it, else None.

        Kept beside the fields (as a ``cached_property`` would be), not as one: it is never stored,
        and a migrated checkpoint equals the same one written at the current schema.
        """
        found: int | None = self.__dict__.get(_MIGRATED_FROM)
        return found


_MIGRATED_FROM = "__migrated_from"


class CheckpointV3(CheckpointV2):
    schema_version: Literal[3] = 3  # type: ignore[assignment]  # each version narrows its literal
    # Where it was written: the task's region and ownership epoch at that transition, so a
    # checkpoint read after a failover says which owner wrote it ("" / 0: written before v3).
    region: str = ""
    ownership_epoch: int = Field(default=0, ge=0)


# The one line an older deployment differs by: the contract this code writes.
Checkpoint = CheckpointV3  # the current contract
CURRENT_SCHEMA: int = Checkpoint.model_fields["schema_version"].default


class CheckpointUnreadable(Exception):
    """A stored checkpoint the running code cannot use; ``reason`` is machine-readable."""

    SCHEMA_NEWER = "checkpoint_schema_newer"
    CORRUPT = "checkpoint_corrupt"
    UNMIGRATABLE = "checkpoint_unmigratable"
    # Integrity: the stored row is not what the transition wrote, or not what this code reads.
    DIGEST_MISMATCH = "checkpoint_digest_mismatch"
    CODEC_MISMATCH = "checkpoint_codec_mismatch"
    SCHEMA_MISMATCH = "checkpoint_schema_mismatch"
    TOO_LARGE = "checkpoint_too_large"
    # A sealed fact cannot be opened: its key is no longer configured, or the token is not what was sealed.
    UNDECRYPTABLE = "checkpoint_undecryptable"

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# Migration chain: MIGRATIONS[n] turns a version-n document (a dict) into a
# version-(n+1) document. Pure functions: no I/O, no clock, no database.
Migration = Callable[[dict[str, Any]], dict[str, Any]]


def _v1_to_v2(document: dict[str, Any]) -> dict[str, Any]:
    """v2 records the writing deployment; a v1 checkpoint's is unknown."""
    return {**document, "deployment": document.get("deployment", "")}


def _v2_to_v3(document: dict[str, Any]) -> dict[str, Any]:
    """v3 records the writing region and ownership epoch; a v2 checkpoint's are unknown."""
    return {
        **document,
        "region": document.get("region", ""),
        "ownership_epoch": document.get("ownership_epoch", 0),
    }


MIGRATIONS: dict[int, Migration] = {1: _v1_to_v2, 2: _v2_to_v3}


def _readable() -> frozenset[int]:
    """``CURRENT_SCHEMA`` and every older version with an unbroken chain of migrations up to it."""
    versions = {CURRENT_SCHEMA}
    version = CURRENT_SCHEMA - 1
    while version in MIGRATIONS:
        versions.add(version)
        version -= 1
    return frozenset(versions)


# The schema versions this code loads. Newer ones belong to a newer deployment: its workers
# claim those tasks, this code's never do (``tasks.leases``).
READABLE = _readable()


def migration_chain() -> str:
    """The versions this code migrates through, oldest first: ``"1 -> 2 -> 3"``."""
    return " -> ".join(str(version) for version in sorted(READABLE))


def place(task_id: Any, state_version: Any) -> sealing.Place:
    """Where a checkpoint's sealed values belong: its task and version (then the path to the field)."""
    return ("checkpoint", str(task_id), state_version)


def encode(checkpoint: Checkpoint, *, sealed: Collection[str] = ()) -> str:
    """The stored body of ``checkpoint``, with the facts named in ``sealed`` sealed."""
    document = checkpoint.model_dump(mode="json")
    if sealed:
        at = (*place(checkpoint.task_id, checkpoint.state_version), "facts")
        document["facts"] = sealing.seal_fields(document["facts"], sealed, at)
    return canonical.dumps(document, version=canonical.V1_ASCII)


def digest(body: str) -> str:
    """SHA-256 (hex) of a stored body with its envelopes blanked, as the row and its audit event record it."""
    return canonical.digest_text(sealing.blank(body))


def max_bytes() -> int:
    """Largest stored body a worker writes or loads (``CHECKPOINT_MAX_BYTES``)."""
    limit: int = settings.CHECKPOINT_MAX_BYTES  # the settings module reads it with django-environ (untyped)
    return limit


def verify_stored(body: str, *, codec: str, stored_digest: str, recorded_digest: str | None) -> None:
    """Refuse a stored body before parsing it.

    ``stored_digest`` is the row's digest, ``recorded_digest`` the one the audit
    event of the same version recorded (None: no such event). A row and event
    both without a digest were written before digests existed and pass.
    Raises ``CheckpointUnreadable`` with reason ``checkpoint_too_large``,
    ``checkpoint_codec_mismatch`` or ``checkpoint_digest_mismatch``.
    """
    limit = max_bytes()
    # Characters <= bytes: a body already too long in characters is not encoded to find out.
    size = len(body) if len(body) > limit else len(body.encode())
    if size > limit:
        raise CheckpointUnreadable(CheckpointUnreadable.TOO_LARGE, f"{size} bytes, limit {limit}")
    if codec != CODEC:
        raise CheckpointUnreadable(
            CheckpointUnreadable.CODEC_MISMATCH, f"stored as {codec!r}, this code reads {CODEC!r}"
        )
    if not stored_digest and not recorded_digest:
        return  # written before checkpoints carried digests
    if recorded_digest is None:
        raise CheckpointUnreadable(
            CheckpointUnreadable.DIGEST_MISMATCH, "no audit event records this checkpoint"
        )
    if stored_digest != recorded_digest:
        raise CheckpointUnreadable(
            CheckpointUnreadable.DIGEST_MISMATCH,
            "the row's digest differs from the one its audit event recorded",
        )
    if digest(body) != stored_digest:
        raise CheckpointUnreadable(
            CheckpointUnreadable.DIGEST_MISMATCH, "the body does not match the digest it was written with"
        )


def decode_stored(row: Any, *, recorded_digest: str | None) -> Checkpoint:
    """Verify, then decode, a stored ``tasks.models.Checkpoint`` row.

    ``recorded_digest``: the ``checkpoint_digest`` of the row's audit event
    (None when there is none). Raises ``CheckpointUnreadable`` with any reason
    of ``verify_stored`` or ``decode``.
    """
    verify_stored(row.body, codec=row.codec, stored_digest=row.digest, recorded_digest=recorded_digest)
    return decode(row.body, row.schema_version)


def decode(body: str, schema_version: int | None = None) -> Checkpoint:
    """Parse, migrate to ``CURRENT_SCHEMA`` and validate a stored body.

    ``schema_version`` is the row's column: it stands in for a body without
    one, and must agree with a body that has one.

    Raises ``CheckpointUnreadable`` with reason ``checkpoint_schema_newer``
    (written by newer code), ``checkpoint_corrupt`` (not a valid document at
    its own version), ``checkpoint_schema_mismatch`` (the column and the body
    disagree), ``checkpoint_undecryptable`` (a sealed fact cannot be opened
    here) or ``checkpoint_unmigratable`` (no migration path, or a migration
    step failed).

    A checkpoint migrated from an older version says from which
    (``migrated_from``), so the worker records the migration.
    """
    try:
        document = json.loads(body)
    except (TypeError, ValueError) as exc:
        raise CheckpointUnreadable(CheckpointUnreadable.CORRUPT, f"not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise CheckpointUnreadable(CheckpointUnreadable.CORRUPT, "top level is not an object")
    version = document.get("schema_version", schema_version)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise CheckpointUnreadable(CheckpointUnreadable.CORRUPT, f"bad schema_version {version!r}")
    if schema_version is not None and version != schema_version:
        raise CheckpointUnreadable(
            CheckpointUnreadable.SCHEMA_MISMATCH,
            f"stored as schema {schema_version}, the body says {version}",
        )
    if version > CURRENT_SCHEMA:
        raise CheckpointUnreadable(
            CheckpointUnreadable.SCHEMA_NEWER, f"schema {version} is newer than {CURRENT_SCHEMA}"
        )
    if sealing.has_envelopes(body):
        document = _opened(document)
    document = migrate(document, version)
    try:
        checkpoint = Checkpoint.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(root)"
        raise CheckpointUnreadable(
            CheckpointUnreadable.CORRUPT, f"{where}: {first['msg']} ({exc.error_count()} errors)"
        ) from None
    if version < CURRENT_SCHEMA:
        checkpoint.__dict__[_MIGRATED_FROM] = version  # frozen: beside the fields, see ``migrated_from``
    return checkpoint


def _opened(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with its sealed values opened, each checked against the task and version it names."""
    try:
        opened: dict[str, Any] = sealing.open_all(
            document, place(document.get("task_id"), document.get("state_version"))
        )
    except sealing.Unopenable as exc:
        raise CheckpointUnreadable(CheckpointUnreadable.UNDECRYPTABLE, str(exc)) from None
    except ImproperlyConfigured as exc:  # no keys at all in this process
        raise CheckpointUnreadable(CheckpointUnreadable.UNDECRYPTABLE, str(exc)) from None
    return opened


def migrate(document: dict[str, Any], version: int) -> dict[str, Any]:
    """Walk the chain from ``version`` to ``CURRENT_SCHEMA``."""
    while version < CURRENT_SCHEMA:
        step = MIGRATIONS.get(version)
        if step is None:
            raise CheckpointUnreadable(
                CheckpointUnreadable.UNMIGRATABLE, f"no migration from schema {version}"
            )
        try:
            document = step(dict(document))
        except Exception as exc:  # a migration is foreign code to the caller: report, never crash
            raise CheckpointUnreadable(
                CheckpointUnreadable.UNMIGRATABLE,
                f"migration {version}->{version + 1} failed: {type(exc).__name__}: {exc}",
            ) from None
        metrics.checkpoint_migrated(version)  # durable_checkpoint_migrations
        version += 1
        document["schema_version"] = version
    return document


def json_schema() -> dict[str, Any]:
    """JSON Schema of the current contract (``manage.py checkpoints schema``)."""
    return Checkpoint.model_json_schema()
