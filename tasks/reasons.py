"""Every reason code a person can meet on a task: the one registry.

A reason code is the machine-readable *why* of a transition: the task's ``state_reason``, the
``reason_code`` of its audit events, and the ``reason`` of a failed or expired task's outcome. The code
that moves tasks still spells them where it decides (``runtime``, ``tasks``, ``approvals``, the task
types in ``workflows``); this module says what each one means and where a person meets it, and
``tests/docs/test_reason_registry.py`` scans that code with ``ast`` so that a code with no entry here,
or an entry no code produces, fails the tests. The docs' reason-code reference is rendered from this
module (``scripts/docs_reference.py``), joined with the console's release guidance.

An entry whose code is not written as a literal anywhere (``cancel:children``, ``approval_approved``
…) says where it is built at run time in ``dynamic``; the scan accepts it without a literal.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a person meets a code: the state the task is in, or the record that carries it.
QUARANTINED = "quarantined"
FAILED = "failed"
WAITING_RETRY = "waiting_retry"
EXPIRED = "expired"
CANCELED = "canceled"
EVENT = "audit event"  # a step of the task's history, the task itself goes on
ALERT = "alert"


@dataclass(frozen=True)
class Reason:
    code: str
    where: tuple[str, ...]
    meaning: str
    dynamic: str = ""  # set when the code is built at run time: where it is built


def _r(code: str, where: str | tuple[str, ...], meaning: str, dynamic: str = "") -> Reason:
    return Reason(code, (where,) if isinstance(where, str) else where, meaning, dynamic)


_CONTROL = "runtime/controls.py: an operator's control names itself (`reason_code = control`)"
_GATE = 'runtime/engine.py: `f"approval_{verdict}"`, the verdict of `approvals.gate` on an approved action'
_DECIDED = 'approvals/services.py: `f"approval_{status}"`, the approver\'s decision'
_SCOPE = 'runtime/controls.py: `f"cancel:{scope}"`, the scope an operator picked (`CancelScope`)'

REASONS: tuple[Reason, ...] = (
    # --- checkpoints the running code cannot use (tasks.checkpoints.CheckpointUnreadable) ---
    _r(
        "checkpoint_schema_newer", QUARANTINED, "The checkpoint was written by newer code than this worker's."
    ),
    _r(
        "checkpoint_unmigratable",
        QUARANTINED,
        "No migration leads from the checkpoint's schema to this code's.",
    ),
    _r("checkpoint_corrupt", QUARANTINED, "The stored checkpoint does not decode."),
    _r(
        "checkpoint_digest_mismatch",
        QUARANTINED,
        "The checkpoint is not what its transition wrote (altered).",
    ),
    _r(
        "checkpoint_codec_mismatch",
        QUARANTINED,
        "The checkpoint is stored under a codec this code does not read.",
    ),
    _r("checkpoint_schema_mismatch", QUARANTINED, "The checkpoint's body and its recorded schema disagree."),
    _r("checkpoint_too_large", QUARANTINED, "The checkpoint is above the size limit."),
    _r(
        "checkpoint_undecryptable",
        QUARANTINED,
        "A sealed fact cannot be opened: its key is gone or it was altered.",
    ),
    _r("checkpoint_missing", QUARANTINED, "The task has no checkpoint to resume from."),
    _r(
        "checkpoint_migrated",
        EVENT,
        "The checkpoint was read through a schema migration before the step ran.",
    ),
    _r("deployment_changed", EVENT, "A worker of another deployment picked the task up; it goes on there."),
    # --- steps and their evidence ---
    _r("step_error", QUARANTINED, "A step raised an error; released, the task resumes at the same step."),
    _r("step_timeout", WAITING_RETRY, "A step ran past its time limit; it is tried again after a backoff."),
    _r("retries_exhausted", FAILED, "A transient failure came back on every attempt the task type allows."),
    _r("unknown_step", QUARANTINED, "The checkpoint names a step the task type no longer has."),
    _r("unknown_step_kind", QUARANTINED, "The step is of a kind this worker does not know how to run."),
    _r("evidence_unavailable", WAITING_RETRY, "An outside record could not be fetched; tried again later."),
    _r(
        "evidence_unstorable",
        QUARANTINED,
        "An outside record cannot be stored as it is (fix it at the source).",
    ),
    _r(
        "evidence_missing",
        (QUARANTINED, FAILED),
        "An evidence record the task relies on vanished (held on resuming; failed in a step).",
    ),
    _r(
        "evidence_changed",
        EVENT,
        "An outside record changed while the task waited; what depends on it is redone.",
    ),
    _r(
        "event_undecryptable",
        QUARANTINED,
        "A sealed value of the external event the task waits on cannot be opened.",
    ),
    _r(
        "duplicate_reference",
        FAILED,
        "The money policy found this reference already paid, or being paid, elsewhere.",
    ),
    _r("children_done", EVENT, "Every child task ended; the parent goes on."),
    _r("children_incomplete", FAILED, "Not every child task completed, and the step has no path for that."),
    _r("deadline_passed", EXPIRED, "The task's own deadline passed before it finished."),
    _r("wait_expired", EXPIRED, "A wait (approval, outside event) ran past its deadline."),
    _r("backoff_elapsed", EVENT, "The backoff after a transient failure ended; the task is tried again."),
    # --- resume validation: what changed while the task waited ---
    _r("revalidated", EVENT, "Resume validation found nothing changed; the task goes on."),
    _r(
        "policy_changed",
        EVENT,
        "The policy changed while the task waited, in a way that matters: asked again.",
    ),
    _r(
        "policy_changed_immaterial",
        EVENT,
        "The policy changed while the task waited, in no way that matters here.",
    ),
    _r("runtime_config_replaced", EVENT, "A new approved runtime config applies from here on."),
    _r("runtime_config_unapproved", QUARANTINED, "No approved runtime config covers the task."),
    _r("owner_access_revoked", QUARANTINED, "The person who started the task no longer operates the tenant."),
    _r("approver_access_revoked", EVENT, "The approver lost the role: the approval is asked again."),
    # --- approvals ---
    _r(
        "approval_requested", EVENT, "The task asks a person to approve an action; it waits for the decision."
    ),
    _r("approval_approved", EVENT, "An approver approved the request.", _DECIDED),
    _r("approval_rejected", EVENT, "An approver rejected the request.", _DECIDED),
    _r(
        "approval_reapprove",
        EVENT,
        "The approved action or its facts changed: approval is asked again.",
        _GATE,
    ),
    _r(
        "approval_refresh",
        EVENT,
        "At the send, the approval rested on stale evidence: fetched again first.",
        _GATE,
    ),
    _r(
        "approval_needs_fresh_evidence",
        EVENT,
        "The approval rests on stale evidence: the task fetches it again.",
    ),
    _r("payment_rejected_by_approver", FAILED, "`pay_invoice`: the approver rejected the payment."),
    _r("refund_rejected_by_approver", FAILED, "`refund_request`: the approver rejected the refund."),
    _r("refund_rejected_by_payments", FAILED, "`refund_request`: the payment system refused the refund."),
    _r(
        "refund_needs_manual_review",
        FAILED,
        "`refund_request`: the refund needs a person's review outside the system.",
    ),
    # --- side effects and the action ledger ---
    _r(
        "dispatch_unknown",
        EVENT,
        "A send was cut short: whether the effect happened is unknown until reconciled.",
    ),
    _r("reconciled", EVENT, "A lookup settled an effect whose outcome was unknown."),
    _r("effect_absent", EVENT, "A lookup found an effect in doubt did not happen; it may be sent again."),
    _r(
        "resend_limit_reached",
        QUARANTINED,
        "The effect was sent the maximum number of times without landing.",
    ),
    _r("unknown_outcome_overdue", (EVENT, ALERT), "An effect's outcome stayed unknown too long."),
    _r("late_effect_found", EVENT, "An effect thought absent landed late; the outcome is amended."),
    _r("effect_rejected", FAILED, "The outside system refused the effect."),
    _r("effect_reused", EVENT, "A rerun reused the outcome of the task it reruns: nothing was sent again."),
    _r("effect_deduplicated", EVENT, "The outside system already had this key and did not do it twice."),
    _r(
        "effect_changed_after_intent",
        QUARANTINED,
        "The facts changed after the effect was intended; nothing sent.",
    ),
    _r(
        "effect_digest_mismatch",
        (QUARANTINED, ALERT),
        "An effect about to be sent is not the one intended or approved.",
    ),
    _r("key_scheme_quarantine_lifted", EVENT, "A rollout of a new idempotency-key scheme released the task."),
    _r("compensated", EVENT, "An effect was undone by its compensation step."),
    _r("compensation_rejected", FAILED, "The outside system refused the compensating effect."),
    _r("compensation_canceled", FAILED, "The compensating effect's call was canceled."),
    _r("compensation_not_approved", FAILED, "The approver rejected the compensation."),
    _r(
        "compensation_step_missing",
        QUARANTINED,
        "The task type no longer has the step that undoes this effect.",
    ),
    # --- people at the console ---
    _r("quarantine", QUARANTINED, "An operator held the task by hand (their reason says why)."),
    _r("release", EVENT, "An operator released a quarantined task.", _CONTROL),
    _r(
        "retry_migration",
        EVENT,
        "An operator released it after deploying code that reads its checkpoint.",
        _CONTROL,
    ),
    _r("retry", EVENT, "An operator started a failed task again.", _CONTROL),
    _r("escalate", EVENT, "An operator escalated the task to another role.", _CONTROL),
    _r("reconcile", EVENT, "An operator asked the ledger to settle effects in doubt.", _CONTROL),
    _r("cancel:task", (EVENT, CANCELED), "Cancel of the whole task (and its children) was requested."),
    _r("cancel:children", EVENT, "Cancel of the task's running children was requested.", _SCOPE),
    _r("cancel:tool_call", EVENT, "Cancel of a side effect not yet sent was requested."),
    _r("cancel:model_turn", EVENT, "Cancel of the agent's current model turn was requested."),
    _r(
        "tool_call_canceled",
        FAILED,
        "A cancel withdrew the side effect unsent, and the task cannot go on without it.",
    ),
    _r("failover", EVENT, "The task moved to another region in a failover."),
    _r(
        "forked",
        EVENT,
        "An operator resumed this ended task from one of its checkpoints as a new task (the event names it).",
    ),
    _r(
        "forked_from",
        EVENT,
        "Started from another task's checkpoint (the event names both); every approval is asked again.",
    ),
    # --- models and agents ---
    _r("model_unavailable", WAITING_RETRY, "The model could not be reached or refused; tried again later."),
    _r(
        "model_output_invalid",
        WAITING_RETRY,
        "The model's answer was not of the declared shape; tried again.",
    ),
    _r("model_unconfigured", QUARANTINED, "MODEL_BACKEND is `openai` but MODEL_URL or MODEL_NAME is unset."),
    _r("agents_sdk_missing", QUARANTINED, "The task type runs an agent and the worker lacks the Agents SDK."),
    _r("agent_turn", EVENT, "The agent took a model turn; its record is stored."),
    _r("agent_handoff", EVENT, "The agent handed the run to another agent."),
    _r("agent_tool_call", EVENT, "The agent called a tool; the call is recorded before it runs."),
    _r("agent_evidence", EVENT, "A tool call's answer was recorded as evidence."),
    _r("agent_finished", EVENT, "The agent gave its final answer."),
    _r("agent_guardrail_tripped", FAILED, "An input or output guardrail of the agent tripped."),
    _r("agent_max_turns", FAILED, "The agent took more turns than allowed without a final answer."),
    _r("agent_handoff_unsupported", QUARANTINED, "The agent hands off to something that is not an Agent."),
    _r("agent_model_unset", QUARANTINED, "The agent names no model and no model backend is configured."),
    _r("agent_model_retired", QUARANTINED, "The model the run started with is retired."),
    _r("agent_tool_unsupported", QUARANTINED, "The agent has a tool that is not a function tool."),
    _r("agent_tool_undeclared", QUARANTINED, "The agent called a tool the task type does not declare."),
    _r("agent_tool_removed", QUARANTINED, "A tool the run used is gone from the task type."),
    _r("agent_toolset_changed", EVENT, "The agent's tool set changed while the task waited: asked again."),
    _r("agent_memory_unreadable", QUARANTINED, "The stored record of the agent's turns cannot be read."),
    _r("agent_pause_undecidable", QUARANTINED, "The run paused in a way the worker cannot decide on."),
    _r(
        "agent_call_id_reused",
        QUARANTINED,
        "The model reused a tool call id; none of the turn's calls is made.",
    ),
    _r(
        "agent_arguments_malformed",
        EVENT,
        "A tool call's arguments are malformed; the model is told, nothing runs.",
    ),
    _r(
        "agent_argument_unbound",
        (EVENT, QUARANTINED),
        "A call names arguments the evidence does not vouch for.",
    ),
    _r(
        "agent_snapshot_tampered", (QUARANTINED, ALERT), "The stored run state of a paused agent was altered."
    ),
    _r("agent_snapshot_newer_schema", QUARANTINED, "The stored run state was written by a newer Agents SDK."),
    _r("agent_snapshot_too_large", QUARANTINED, "The agent's run state is above AGENT_SNAPSHOT_MAX_BYTES."),
    # --- alerts (runtime.models.AlertKind): a task, or a tenant, nobody moves unless someone looks ---
    _r("no_live_lease", ALERT, "The task is runnable and no worker holds it."),
    _r("wait_past_deadline", ALERT, "The task waits past its deadline and the sweeper has not moved it."),
    _r("quarantine_overdue", ALERT, "The task has been quarantined too long."),
    _r("cancel_unconfirmed", ALERT, "A cancel request was not confirmed by a worker in time."),
    _r(
        "orphan_effects_open",
        ALERT,
        "After a restore, an outside system holds effects no ledger row explains.",
    ),
    _r("push_receiver_failing", ALERT, "An A2A push receiver keeps failing."),
)

BY_CODE: dict[str, Reason] = {reason.code: reason for reason in REASONS}


def meaning(code: str) -> str:
    """What ``code`` means, for a page that shows one (empty for a code the registry does not know)."""
    reason = BY_CODE.get(code)
    return reason.meaning if reason else ""
