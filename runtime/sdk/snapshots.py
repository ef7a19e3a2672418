"""The SDK's paused run state, kept as an artifact: sealed, sized, MAC'd, and checked before use.

A pause stores ``RunState.to_string()`` (``AgentSnapshot``): the text sealed to its task (it holds
the conversation), its size bounded by ``AGENT_SNAPSHOT_MAX_BYTES``, and a MAC under the audit
chain key over what it is — task, step, turns before the pause, SDK schema version and a digest of
the text — so a row copied from another task, edited, or swapped for another pause's does not verify.

``opened`` gives the text back only when all of that holds and this worker's SDK reads the schema;
otherwise it raises ``SnapshotRefused`` with the reason code the task's quarantine records. Nothing
here decides what the run does: the ledger and our approvals do (``runtime.sdk.step``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings

from audit import canonical, sealing
from audit.keys import chain_keys, current_chain_key
from runtime.models import AgentSnapshot
from tasks.models import Task

TAMPERED = "agent_snapshot_tampered"
NEWER_SCHEMA = "agent_snapshot_newer_schema"
TOO_LARGE = "agent_snapshot_too_large"


class SnapshotRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _place(task_id: object, step: str) -> sealing.Place:
    return sealing.task_place(task_id, "agent_snapshots", step)


def _fields(task_id: object, step: str, turns: int, schema: str, text: str) -> dict[str, object]:
    return {
        "task": str(task_id),
        "step": step,
        "turns": turns,
        "schema": schema,
        "body": hashlib.sha256(text.encode()).hexdigest(),
    }


def _mac(fields: dict[str, object], secret: bytes) -> str:
    message = "agent-snapshot\n" + canonical.dumps(fields, version=canonical.V2)
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()


def taken(
    task: Task, step: str, turns: int, text: str, *, schema: str, sdk_version: str, now: datetime
) -> AgentSnapshot:
    """The row storing ``text`` (unsaved: it commits with the transition that pauses the run).

    Raises ``SnapshotRefused`` (``TOO_LARGE``) for a state above the size limit."""
    size = len(text.encode())
    if size > settings.AGENT_SNAPSHOT_MAX_BYTES:
        raise SnapshotRefused(
            TOO_LARGE,
            f"the agent's run state is {size} bytes, above AGENT_SNAPSHOT_MAX_BYTES "
            f"({settings.AGENT_SNAPSHOT_MAX_BYTES})",
        )
    key = current_chain_key()
    return AgentSnapshot(
        task=task,
        step=step,
        turns=turns,
        schema_version=schema,
        sdk_version=sdk_version,
        body=sealing.seal(text, _place(task.id, step)),
        size=size,
        mac=_mac(_fields(task.id, step, turns, schema, text), key.secret),
        key_id=key.id,
        state_version=task.state_version,
        created_at=now,
    )


def fact_name(step: str) -> str:
    """The fact counting the run states ``step`` stored: 0 from the run's first turn, one more with
    each pause, in the pause's own commit. The checkpoint then says whether there is one to read."""
    return f"{step}:snapshots"


def latest(task: Task, step: str, facts: Mapping[str, Any] | None = None) -> AgentSnapshot | None:
    """The run's newest stored state. With the checkpoint's ``facts``: none without reading, when
    they say the run has stored none (a run begun before the count was kept is read as before)."""
    if facts is not None and _none_stored(facts.get(fact_name(step))):
        return None
    return AgentSnapshot.objects.filter(task=task, step=step).order_by("-id").first()


def _none_stored(count: Any) -> bool:
    return isinstance(count, int) and not isinstance(count, bool) and count == 0


def counted(facts: Mapping[str, Any], step: str) -> dict[str, Any]:
    """``facts`` with one more stored state counted (for the commit that stores it); a run begun
    before the count was kept stays uncounted, so it is still read every step."""
    stored = facts.get(fact_name(step))
    return {**facts, fact_name(step): stored + 1} if isinstance(stored, int) else dict(facts)


def opened(snapshot: AgentSnapshot, *, readable: frozenset[str]) -> str:
    """The stored text, once its MAC verifies and its schema is one of ``readable`` (the worker's
    SDK's). Raises ``SnapshotRefused``: ``TAMPERED`` or ``NEWER_SCHEMA``."""
    where = f"agent snapshot {snapshot.pk} of task {snapshot.task_id}"
    try:
        text = sealing.open_envelope(snapshot.body, _place(snapshot.task_id, snapshot.step), where=where)
    except sealing.Unopenable as exc:
        raise SnapshotRefused(TAMPERED, f"{where} cannot be opened: {exc}") from None
    secret = chain_keys().get(snapshot.key_id)
    fields = _fields(snapshot.task_id, snapshot.step, snapshot.turns, snapshot.schema_version, str(text))
    if (
        not isinstance(text, str)
        or secret is None
        or not hmac.compare_digest(snapshot.mac, _mac(fields, secret))
    ):
        raise SnapshotRefused(TAMPERED, f"{where} does not match its MAC: altered or not this pause's")
    inside = _schema_in(text)
    if inside != snapshot.schema_version:
        raise SnapshotRefused(
            TAMPERED, f"{where} says schema {inside!r}, its row {snapshot.schema_version!r}"
        )
    if snapshot.schema_version not in readable:
        raise SnapshotRefused(
            NEWER_SCHEMA,
            f"{where} was written by SDK {snapshot.sdk_version} (run state schema {snapshot.schema_version}),"
            f" which this worker's SDK cannot read (it reads up to {max(readable, key=_numeric)}):"
            " release it once workers with that SDK run",
        )
    return text


def _schema_in(text: str) -> str:
    try:
        value = json.loads(text).get("$schemaVersion")
    except (ValueError, AttributeError):
        return ""
    return str(value or "")


def _numeric(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())
