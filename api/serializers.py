"""What the API answers with: tasks, their history, approvals. Read-only serializers.

Request bodies are parsed by the input serializer nested in each view
(``api.views``); ``storable`` is the guard their free-form fields share.
"""

from __future__ import annotations

from typing import Any, TypedDict

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from approvals import selectors as approval_selectors
from approvals.models import ApprovalRequest
from audit import sealing
from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS
from audit.models import TransitionEvent
from ledger.models import Action
from protection import retention, reveal
from reads import approval_detail, task_detail, task_types
from tasks import checkpoints, registry, values
from tasks.models import Checkpoint, Task
from tenancy.models import Tenant


def storable(value: Any, where: str = "input") -> None:
    """A value PostgreSQL cannot hold (NUL, lone surrogate, NaN, in a key or a value) is bad
    input: a 400 naming where it sits, never a 500 from the database (``tasks.values``)."""
    try:
        values.check(value, where)
    except values.Unstorable as exc:
        raise serializers.ValidationError(str(exc)) from None


# --- tasks -----------------------------------------------------------------------------------------


class TaskSummary(serializers.ModelSerializer[Task]):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = Task
        fields = [
            "id",
            "tenant",
            "task_type",
            "objective",
            "state",
            "state_version",
            "state_reason",
            "region",
            "attempt",
            "escalation_level",
            "deadline",
            "wait_deadline",
            "created_at",
            "updated_at",
            "state_entered_at",
        ]
        read_only_fields = fields


# One task as ``GET /api/tasks/{id}/`` shows it, rendered from a ``reads.task_detail.TaskDetail`` (the
# console's task page renders the same object): serialize that, not the task (``task_detail_data``).
# No docstring: drf-spectacular would put it in the pinned OpenAPI document.
class TaskDetail(TaskSummary):
    owner: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    runtime_config = serializers.SerializerMethodField()
    escalation = serializers.SerializerMethodField()
    lease = serializers.SerializerMethodField()
    pending_approvals = serializers.SerializerMethodField()
    ledger = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    allowed_transitions = serializers.SerializerMethodField()
    reruns = serializers.SerializerMethodField()
    children = serializers.SerializerMethodField()
    cancel_requests = serializers.SerializerMethodField()
    compensations = serializers.SerializerMethodField()
    compensates = serializers.SerializerMethodField()

    class Meta(TaskSummary.Meta):
        fields = TaskSummary.Meta.fields + [
            "owner",
            "parent",
            "children",
            "cancel_requests",
            "rerun_of",
            "reruns",
            "compensations",
            "compensates",
            "input",
            "outcome",
            "idempotency_key",
            "policy_version",
            "runtime_config",
            "escalation",
            "lease",
            "pending_approvals",
            "ledger",
            "usage",
            "allowed_transitions",
        ]
        read_only_fields = fields

    @property
    def _detail(self) -> task_detail.TaskDetail:
        # The read this rendering is of (``context["detail"]``, see ``task_detail_data``): the row's
        # own fields come from the task, each method field below reads its section of the detail.
        detail: task_detail.TaskDetail = self.context["detail"]
        return detail

    def to_representation(self, instance: Task) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        # Sensitive fields masked; POST /api/tasks/{id}/reveal/ shows one, to those entitled, recorded.
        data["input"] = self._detail.input
        data["outcome"] = self._detail.outcome
        return data

    def get_runtime_config(self, task: Task) -> dict[str, str]:
        return {"model": task.model_id, "prompt": task.prompt_id, "tool_set": task.toolset_id}

    def get_escalation(self, task: Task) -> dict[str, Any]:
        return {"level": task.escalation_level, "to": task.escalated_to, "reason": task.escalation_reason}

    def get_lease(self, task: Task) -> dict[str, Any] | None:
        lease = self._detail.lease
        if lease is None:
            return None
        return {
            "worker_id": lease.worker_id,
            "token": lease.token,
            "heartbeat_at": lease.heartbeat_at,
            "expires_at": lease.expires_at,
            "live": self._detail.lease_live,
            # Newest first: leases reclaimed from workers that stopped heartbeating.
            "takeovers": [
                {
                    "worker_id": t.worker_id,
                    "token": t.token,
                    "previous_worker_id": t.previous_worker_id,
                    "stale_token": t.stale_token,
                    "previous_heartbeat_at": t.previous_heartbeat_at,
                    "previous_expires_at": t.previous_expires_at,
                    "taken_at": t.taken_at,
                    "heartbeat_age_seconds": (t.taken_at - t.previous_heartbeat_at).total_seconds(),
                }
                for t in self._detail.takeovers
            ],
        }

    def get_pending_approvals(self, task: Task) -> list[dict[str, Any]]:
        return [
            {
                "id": r.id,
                "step": r.step,
                "action_step": r.action_step,
                "digest": r.digest,
                "expires_at": r.expires_at,
            }
            for r in self._detail.pending_approvals
        ]

    def get_ledger(self, task: Task) -> dict[str, int]:
        return self._detail.ledger

    def get_usage(self, task: Task) -> dict[str, Any]:
        """What the task's model turns used: turns, tokens in and out, and cost at the configured prices
        (a decimal string; null when any turn was unpriced, ``unpriced`` counting those)."""
        usage = self._detail.usage
        return {
            "turns": usage.turns,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cost": None if usage.cost is None else str(usage.cost),
            "unpriced": usage.unpriced,
        }

    def get_reruns(self, task: Task) -> list[str]:
        """Ids of the tasks started to run this one again, oldest first (``rerun_of``'s FK index)."""
        return [str(rerun.id) for rerun in self._detail.reruns]

    def get_children(self, task: Task) -> list[dict[str, str]]:
        """The tasks this one started (``StartChildren``), oldest first, with their states."""
        return [
            {"id": str(child.id), "task_type": child.task_type, "state": child.state}
            for child in self._detail.children
        ]

    def get_cancel_requests(self, task: Task) -> list[dict[str, Any]]:
        """Every cancel request, newest first: scope, who asked at which version, and what came of it."""
        return [
            {
                "scope": r.scope,
                "status": r.status,
                "requested_by": r.requested_by,
                "requested_version": r.requested_version,
                "requested_at": r.requested_at,
                "reason": r.reason,
                "resolved_at": r.resolved_at,
                "resolution": r.resolution,
            }
            for r in self._detail.cancel_requests
        ]

    def get_compensations(self, task: Task) -> list[dict[str, Any]]:
        """A canceled task's effects left done that its type can undo, each with its newest run and
        whether another may start (``POST /api/tasks/{id}/compensate/``)."""
        return [
            {
                "action": offer.action.idempotency_key,
                "step": offer.action.step,
                "connector": offer.action.connector,
                "external_ref": offer.action.external_ref,
                "compensation": offer.step,
                "run": str(offer.run.id) if offer.run else None,
                "run_state": offer.run.state if offer.run else None,
                "undo_state": offer.undo,  # the newest compensating action's dispatch state
                "may_start": offer.open,
            }
            for offer in self._detail.compensations
        ]

    def get_compensates(self, task: Task) -> dict[str, str] | None:
        """For a compensation run: the canceled task and the action it undoes."""
        action = self._detail.compensates
        return None if action is None else {"task": str(action.task_id), "action": action.idempotency_key}

    def get_allowed_transitions(self, task: Task) -> list[dict[str, str]]:
        return self._detail.allowed_moves


# What the API lists of a task's detail: every child, cancel request, rerun and pending approval; its
# other approvals and its actions have their own endpoints (``/api/approvals/``, ``.../actions/``).
API_SECTIONS = task_detail.Sections(
    children=None, cancel_requests=None, reruns=None, pending_approvals=None, approvals=0, actions=0
)


def task_detail_data(task: Task, user: Any) -> dict[str, Any]:
    """The JSON of ``task``'s detail as ``user`` sees it (``task`` already scoped to them)."""
    detail = task_detail.read_task_detail(task, user=user, sections=API_SECTIONS)
    return dict(TaskDetail(detail.task, context={"detail": detail}).data)


class EventOut(serializers.ModelSerializer[TransitionEvent]):
    class Meta:
        model = TransitionEvent
        # Every hashed field (so an auditor can recompute the chain), bar the task's own ids, and the
        # id of the AUDIT_HMAC_KEYS key that made the hash ("" for a legacy, unkeyed link).
        fields = [name for name in HASHED_FIELDS if name not in ("task_id", "tenant_id")] + [
            *OPTIONAL_HASHED_FIELDS,
            "prev_hash",
            "hash",
            "key_id",
        ]
        read_only_fields = fields


class _Decoded(TypedDict):
    """A checkpoint row as the API shows it: its document, or why it cannot be read."""

    ok: bool
    document: dict[str, Any]


class CheckpointOut(serializers.ModelSerializer[Checkpoint]):
    document = serializers.SerializerMethodField()
    readable = serializers.SerializerMethodField()

    class Meta:
        model = Checkpoint
        fields = ["state_version", "schema_version", "codec", "digest", "created_at", "readable", "document"]
        read_only_fields = fields

    def _decoded(self, row: Checkpoint) -> _Decoded:
        cache: dict[Any, _Decoded] = self.__dict__.setdefault("_decoded_rows", {})
        if row.pk not in cache:
            try:
                # recorded_digest: annotated by TaskCheckpointsApi from the row's audit event.
                recorded = row.recorded_digest  # type: ignore[attr-defined]
                document = retention.read_for_review(row, recorded_digest=recorded)
                shown = document.model_dump(mode="json")
                shown["facts"] = reveal.masked_facts(self._task_type(row), shown["facts"])
                cache[row.pk] = {"ok": True, "document": shown}
            except checkpoints.CheckpointUnreadable as exc:
                cache[row.pk] = {"ok": False, "document": {"reason": exc.reason, "detail": exc.detail}}
        return cache[row.pk]

    def _task_type(self, row: Checkpoint) -> str:
        task = self.context.get("task")  # the history views pass the task they list
        return task.task_type if task is not None else row.task.task_type

    def get_readable(self, row: Checkpoint) -> bool:
        return self._decoded(row)["ok"]

    def get_document(self, row: Checkpoint) -> dict[str, Any]:
        return self._decoded(row)["document"]


class ActionOut(serializers.ModelSerializer[Action]):
    effect = serializers.SerializerMethodField()

    class Meta:
        model = Action
        fields = [
            "id",
            "step",
            "idempotency_key",
            "connector",
            "effect",
            "effect_digest",
            "dispatch_state",
            "outcome",
            "external_ref",
            "attempts",
            "last_error",
            "duplicates_suppressed",
            "dispatched_at",
            "unknown_since",
            "checked_at",
            "resolved_at",
            "compensation_of",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_effect(self, action: Action) -> Any:
        """As sent, with the keys the step marks sensitive masked (stored sealed)."""
        task = self.context.get("task")  # the history view passes the task it lists
        task_type = task.task_type if task is not None else action.task.task_type
        names = registry.sensitive_effect_keys(task_type, action.step)
        return sealing.masked_effect(action.idempotency_key, action.effect, names)


class DeliveryOut(serializers.Serializer[None]):  # describes the answer; holds no instance
    applied = serializers.BooleanField(help_text="False: a duplicate, acknowledged and not applied again")
    note = serializers.CharField()
    task = TaskDetail()


# --- approvals -------------------------------------------------------------------------------------


class ApprovalOut(serializers.ModelSerializer[ApprovalRequest]):
    tenant: serializers.SlugRelatedField[Tenant] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    task_type = serializers.CharField(source="task.task_type", read_only=True)
    task_state = serializers.CharField(source="task.state", read_only=True)
    live = serializers.SerializerMethodField()
    decision = serializers.SerializerMethodField()
    # Sensitive values masked (stored sealed); ``digest`` is of the clear values, as approved.
    consequential = serializers.SerializerMethodField()
    material = serializers.SerializerMethodField()

    class Meta:
        model = ApprovalRequest
        fields = [
            "id",
            "tenant",
            "task",
            "task_type",
            "task_state",
            "step",
            "action_step",
            "waiting_version",
            "consequential",
            "digest",
            "material",
            "evidence",
            "policy_reason",
            "policy_version",
            "approver_role",
            "requested_by",
            "allowed_decisions",
            "expires_at",
            "status",
            "live",
            "created_at",
            "decided_at",
            "decision",
        ]
        read_only_fields = fields

    def get_live(self, request: ApprovalRequest) -> bool:
        return approval_selectors.is_live(request)

    # Both columns hold a JSON object (the model types what it shows as any JSON value).
    def get_consequential(self, request: ApprovalRequest) -> dict[str, Any]:
        shown: dict[str, Any] = request.shown_consequential
        return shown

    def get_material(self, request: ApprovalRequest) -> dict[str, Any]:
        shown: dict[str, Any] = request.shown_material
        return shown

    def get_decision(self, request: ApprovalRequest) -> dict[str, Any] | None:
        made = getattr(request, "decision", None)
        if made is None:
            return None
        return {
            "decision": made.decision,
            "by": made.decided_by.get_username(),
            "comment": made.comment,
            "at": made.decided_at,
        }


class EarlierDecisionOut(serializers.Serializer[approval_selectors.EarlierDecision]):
    request = serializers.UUIDField(source="request_id")
    task = serializers.UUIDField(source="task_id")
    decision = serializers.CharField()
    by = serializers.CharField()
    at = serializers.DateTimeField()
    comment = serializers.CharField()


class MayNotDecideOut(serializers.Serializer[approval_selectors.MayNotDecide]):
    actor = serializers.CharField(help_text="user:<username>")
    why = serializers.CharField(help_text='"reran this task, escalated it"')


class ApprovalDetailOut(ApprovalOut):
    """One request with its separation of duties (``approvals.selectors.separation``, as its console
    page shows it): the earlier decisions for the same action on this task or one it reruns (a
    rejection a rerun asks to override), and who may not decide it and why."""

    earlier_decisions = serializers.SerializerMethodField()
    may_not_decide = serializers.SerializerMethodField()

    class Meta(ApprovalOut.Meta):
        fields = [*ApprovalOut.Meta.fields, "earlier_decisions", "may_not_decide"]
        read_only_fields = fields

    @property
    def _detail(self) -> approval_detail.ApprovalDetail:
        # Rendered from the read its console page renders too (``context["detail"]``): the
        # request's own fields from the row, ``live`` and the separation fields from the detail.
        detail: approval_detail.ApprovalDetail = self.context["detail"]
        return detail

    def get_live(self, request: ApprovalRequest) -> bool:
        return self._detail.live

    # arg-type: the stubs let a plain Serializer take one instance only, not many=True's list.
    @extend_schema_field(EarlierDecisionOut(many=True))
    def get_earlier_decisions(self, request: ApprovalRequest) -> list[Any]:
        return list(EarlierDecisionOut(self._detail.separation.earlier, many=True).data)  # type: ignore[arg-type]

    @extend_schema_field(MayNotDecideOut(many=True))
    def get_may_not_decide(self, request: ApprovalRequest) -> list[Any]:
        return list(MayNotDecideOut(self._detail.separation.may_not_decide, many=True).data)  # type: ignore[arg-type]


def approval_detail_data(request: ApprovalRequest) -> dict[str, Any]:
    """The JSON of one visible approval request (``approvals.selectors.get_visible_request``)."""
    detail = approval_detail.read_approval_detail(request)
    return dict(ApprovalDetailOut(detail.request, context={"detail": detail}).data)


# --- task types ------------------------------------------------------------------------------------
# ``GET /api/task-types/``: ``reads.task_types.TaskTypeContract`` as it is (the console's task-types
# page and the A2A agent card show the same contract). No docstrings: they would join the OpenAPI
# document's component descriptions.


class TaskTypeStepOut(serializers.Serializer[task_types.StepContract]):
    name = serializers.CharField()
    kind = serializers.CharField(help_text="The step's class: ReadEvidence, ModelTurn, Dispatch, AgentRun, …")
    next = serializers.CharField(help_text="The step it goes on to (empty for an ending step)")
    detail = serializers.CharField(help_text="What it does, in a few words")


class TaskTypeLimitOut(serializers.Serializer[dict[str, str]]):
    each = serializers.CharField(help_text="Above this amount at once, it asks (a decimal)")
    total = serializers.CharField(help_text="Past this running total over window_seconds, it asks")


class TaskTypeApprovalOut(serializers.Serializer[task_types.ApprovalContract]):
    step = serializers.CharField(help_text="The effect approved: a Dispatch step, or an agent's tool")
    approval_step = serializers.CharField(
        help_text="The step that asks; for an agent's tool <call> stands for each call"
    )
    approver_role = serializers.CharField()
    always = serializers.BooleanField(help_text="False: only as the money policy (limits) says")
    limits = serializers.DictField(child=TaskTypeLimitOut(), help_text="Per currency code")
    agent_step = serializers.CharField(help_text="The AgentRun step whose tool this is (empty otherwise)")
    connector = serializers.CharField()
    expires_after_seconds = serializers.IntegerField()
    reason = serializers.CharField()
    window_seconds = serializers.IntegerField(help_text="The running total's window (0: no money policy)")
    reference_kind = serializers.CharField(help_text="A repeat for the same reference asks (or is refused)")
    on_duplicate = serializers.CharField(help_text='"approve", "refuse", or empty without a reference')
    summary = serializers.CharField(help_text="When it asks, in one sentence")


class TaskTypeInputFieldOut(serializers.Serializer[task_types.InputField]):
    name = serializers.CharField()
    type = serializers.CharField()
    # The metaclass takes declared fields off the class, so these do not shadow Field.required/.default.
    required = serializers.BooleanField()  # type: ignore[assignment]
    sensitive = serializers.BooleanField()
    default = serializers.CharField(help_text="The default as JSON (empty when the field has none)")
    rules = serializers.ListField(child=serializers.CharField())


class TaskTypeOut(serializers.Serializer[task_types.TaskTypeContract]):
    name = serializers.CharField()
    description = serializers.CharField()
    version = serializers.CharField(help_text="Digest of everything else here: changes when any of it does")
    policy_version = serializers.CharField()
    input_schema = serializers.DictField(
        help_text="JSON Schema (draft 2020-12) of input; sensitive fields carry writeOnly and x-sensitive"
    )
    sensitive_fields = serializers.ListField(child=serializers.CharField())
    sensitive_facts = serializers.ListField(
        child=serializers.CharField(), help_text="Facts the task derives that are sealed and masked too"
    )
    input_fields = TaskTypeInputFieldOut(many=True, help_text="input_schema's fields, for people")
    steps = TaskTypeStepOut(many=True)
    approvals = TaskTypeApprovalOut(many=True)
