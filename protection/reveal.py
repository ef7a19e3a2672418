"""Sensitive fields as people see them: masked everywhere, and revealed one at a time on purpose.

What is sensitive is the task type's declaration (``TaskType.sensitive``, see
``audit.sealing``). Every surface — the console's task page, the API's task,
checkpoint and action answers — shows those fields masked through the
functions here. Revealing one is a separate, explicit request: only the
tenant's operators and admins may make it (``REVEAL_ROLES``: they act on the
task and may need to check a card or an address against a complaint; auditors
and approvers see what happened and what is asked of them, masked), and each
one is recorded as an access event (``AccessEvent.Kind.REVEAL``) naming the
task, the field and the version, never the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Subquery

from audit import sealing
from audit.models import TransitionEvent
from tasks import checkpoints, registry, services
from tasks.models import Checkpoint, Task
from tasks.selectors import roles_in
from tenancy.models import AccessEvent, Role
from tenancy.services import record_access

REVEAL_ROLES = frozenset({Role.OPERATOR, Role.ADMIN})


def may_reveal(user: Any, task: Task) -> bool:
    return bool(roles_in(user, task) & REVEAL_ROLES)


# --- masked views ------------------------------------------------------------------------------------


def masked_facts(task_type: str, facts: dict[str, Any]) -> dict[str, Any]:
    return sealing.masked(facts, registry.sensitive_fields(task_type))


def masked_input(task: Task) -> Any:
    """The input with its sensitive fields masked: sealed ones (opened here only to show their tail),
    and those of a row written before they were sealed."""
    return sealing.masked_at(
        task.input, sealing.task_place(task.id, "input"), registry.sensitive_fields(task.task_type)
    )


def masked_outcome(task: Task) -> Any:
    """The outcome with the sensitive facts a completed task reports masked. Only those: an outcome's
    other keys are the system's own words (``{"reason": "retries_exhausted"}`` is a code, not the
    customer's reason)."""
    return sealing.masked_at(
        task.outcome, sealing.task_place(task.id, "outcome"), services.outcome_fields(task.task_type)
    )


def masked_names(task_type: str, mapping: Any, among: frozenset[str] | None = None) -> list[str]:
    """The keys of ``mapping`` shown masked (sensitive, with something in them), sorted."""
    if not isinstance(mapping, dict):
        return []
    names = registry.sensitive_fields(task_type) if among is None else among
    return sorted(key for key, value in mapping.items() if key in names and value not in (None, ""))


def outcome_masked_names(task: Task) -> list[str]:
    return masked_names(task.task_type, task.outcome, services.outcome_fields(task.task_type))


# --- revealing one ---------------------------------------------------------------------------------


class RevealRefused(Exception):
    """Nothing to reveal; ``status`` is the HTTP answer that fits (400, 404 or 409)."""

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message)
        self.code, self.status = code, status


@dataclass(frozen=True)
class Revealed:
    field: str
    value: Any
    source: str  # "checkpoint" or "input"
    state_version: int | None  # the checkpoint's version (None: from the task's input)


def _checkpoint_at(task: Task, version: int) -> checkpoints.Checkpoint:
    recorded = TransitionEvent.objects.filter(
        task_id=OuterRef("task_id"), state_version=OuterRef("state_version")
    ).values("checkpoint_digest")[:1]
    row = (
        Checkpoint.objects.filter(task=task, state_version=version)
        .annotate(recorded_digest=Subquery(recorded))
        .first()
    )
    if row is None:
        raise RevealRefused(f"This task has no checkpoint v{version}.", code="no_such_checkpoint", status=404)
    return checkpoints.decode_stored(row, recorded_digest=row.recorded_digest)


def _find(task: Task, field: str, state_version: int | None) -> Revealed:
    """Where the value is: that checkpoint's facts; without a version, the task's input (what was
    submitted, an address), else the newest checkpoint's facts (what was learned since, a card).
    A checkpoint's integrity is checked as a worker would (``CheckpointUnreadable``)."""
    if state_version is not None:
        document = _checkpoint_at(task, state_version)
        if field in document.facts:
            return Revealed(field, document.facts[field], "checkpoint", document.state_version)
        raise RevealRefused(
            f"Checkpoint v{state_version} has no {field}.", code="field_not_present", status=404
        )
    if isinstance(task.input, dict) and field in task.input:
        try:
            value = sealing.open_all(task.input[field], sealing.task_place(task.id, "input", field))
        except sealing.Unopenable as exc:
            raise RevealRefused(
                f"The input's {field} cannot be read ({exc.problem}, key {exc.key_id!r}).",
                code="input_undecryptable",
                status=409,
            ) from None
        return Revealed(field, value, "input", None)
    try:
        latest = services.latest_checkpoint(task)
    except checkpoints.CheckpointUnreadable as exc:
        if exc.reason != "checkpoint_missing":
            raise
    else:
        if field in latest.facts:
            return Revealed(field, latest.facts[field], "checkpoint", latest.state_version)
    raise RevealRefused(f"This task holds no {field}.", code="field_not_present", status=404)


def reveal_field(
    task: Task,
    *,
    user: Any,
    field: str,
    state_version: int | None = None,
    reason: str = "",
    request: Any = None,
) -> Revealed:
    """The clear value of the sensitive ``field`` of ``task`` (at ``state_version``), recorded.

    The caller has already found ``task`` visible to ``user`` (another tenant's is a 404 there).
    Raises ``PermissionDenied`` without a role in ``REVEAL_ROLES``; ``RevealRefused`` for a field
    the type does not mark sensitive (400: it is shown unmasked already) or one the task does not
    hold (404), or 409 ``input_undecryptable`` for an input field that cannot be opened (its key
    retired); ``CheckpointUnreadable`` when the checkpoint cannot be read (a retired key: 409).
    Only a reveal that returns a value is recorded.
    """
    if not may_reveal(user, task):
        raise PermissionDenied("Revealing a sensitive field needs the operator or admin role in this tenant.")
    if field not in registry.sensitive_fields(task.task_type):
        raise RevealRefused(
            f"{field!r} is not a sensitive field of {task.task_type}: it is shown as it is.",
            code="not_sensitive",
            status=400,
        )
    found = _find(task, field, state_version)
    where = f" version={found.state_version}" if found.state_version is not None else " source=input"
    said = f" reason={' '.join(reason.split())}" if reason.strip() else ""
    record_access(
        AccessEvent.Kind.REVEAL,
        user=user,
        tenant=task.tenant,
        request=request,
        detail=f"task={task.id} field={field}{where}{said}",
    )
    return found
