"""Resume validation: what must still hold before a task leaves a wait.

Checked in order, the first failing check deciding the outcome:

1. task deadline — passed: expire;
2. the step named by the checkpoint still exists — else quarantine;
3. the owner still holds an operating role in the tenant — else quarantine;
   the approver of an approval still in force still holds the approver role —
   else reapprove (a new request); this covers the type's approval steps and
   those an agent's calls made on demand (``<tool>#<call>:approve``);
4. the runtime configuration (model, prompt, tool set) is still approved —
   else replan with the current approved one, or quarantine if none; for an
   agent run (``AgentRun``), the model its next turn asks is not retired, and
   its tool set is the one its turns were planned with (``_agent_changed``);
5. the policy version — changed: the task type says replan or proceed;
6. evidence record versions — a record that changed means refresh; one that
   vanished means quarantine; a system that does not answer means retry.

(The checkpoint schema was checked before: an unreadable checkpoint never
reaches here.) The outcome is the transition's trigger (``proceed``,
``refresh``, ``replan``, ``expire``, ``quarantine``) and its reason lists what
was found, so every resume leaves an audited verdict. Each validation is a span,
``task.resume_validation``, whose ``durable.validation.verdict`` is that trigger.
"""

from __future__ import annotations

from datetime import datetime

from opentelemetry import trace

from approvals import services as approvals
from approvals.models import ApprovalRequest
from runtime import evidence
from runtime.sdk import toolsets
from tasks import metrics, registry
from tasks.checkpoints import Checkpoint, Progress
from tasks.decisions import Decision, quarantine, retry_later
from tasks.models import Policy, RuntimeConfig, Task
from tasks.states import State, Trigger
from tasks.transitions import span_attributes
from tenancy.models import Role
from tenancy.selectors import has_role

tracer = trace.get_tracer(__name__)


@metrics.records_verdict  # durable_resume_validations, by verdict and reason code
def validate(task: Task, checkpoint: Checkpoint, kind: registry.TaskType, now: datetime) -> Decision:
    with tracer.start_as_current_span("task.resume_validation") as span:
        decision = _verdict(task, checkpoint, kind, now)
        if span.is_recording():
            span.set_attributes(
                {
                    **span_attributes(task),
                    "durable.validation.verdict": str(decision.trigger),
                    "durable.validation.reason_code": decision.reason_code,
                }
            )
        return decision


def _verdict(task: Task, checkpoint: Checkpoint, kind: registry.TaskType, now: datetime) -> Decision:
    progress = checkpoint.progress
    if task.deadline is not None and now >= task.deadline:
        return Decision(
            State.EXPIRED,
            Trigger.EXPIRE,
            progress,
            reason="the task's deadline passed",
            reason_code="deadline_passed",
            changes={"outcome": {"reason": "deadline_passed"}},
        )
    if kind.step(checkpoint.step) is None:
        return unknown_step(kind, checkpoint.step, progress)
    if task.owner is not None and not has_role(
        task.owner, task.tenant_id, Role.OPERATOR, Role.ADMIN, Role.INTEGRATOR
    ):
        return quarantine(
            progress, "owner_access_revoked", f"owner {task.owner} no longer operates this tenant"
        )
    reapprove = _approver_gone(task, kind, progress, now)
    if reapprove is not None:
        return reapprove

    replan_to = progress.model_copy(update={"step": kind.replan_step or kind.first_step})
    managed = RuntimeConfig.objects.filter(task_type=task.task_type)
    if (
        managed.exists()
        and not managed.filter(
            model_id=task.model_id, prompt_id=task.prompt_id, toolset_id=task.toolset_id, approved=True
        ).exists()
    ):
        current = managed.filter(current=True).first()
        if current is None:
            return quarantine(
                progress,
                "runtime_config_unapproved",
                f"{task.model_id}/{task.prompt_id}/{task.toolset_id} is no longer approved",
            )
        return Decision(
            State.READY,
            Trigger.REPLAN,
            replan_to,
            reason_code="runtime_config_replaced",
            reason=f"runtime config replaced by {current}",
            changes={
                "model_id": current.model_id,
                "prompt_id": current.prompt_id,
                "toolset_id": current.toolset_id,
            },
        )

    changed_agent = _agent_changed(task, kind, progress, now)
    if changed_agent is not None:
        return changed_agent

    policy = Policy.objects.filter(task_type=task.task_type).first()
    if policy is not None and policy.version != task.policy_version:
        note = f"policy {task.policy_version} -> {policy.version}"
        if kind.on_policy_change == "replan":
            return Decision(
                State.READY,
                Trigger.REPLAN,
                replan_to,
                reason=note,
                reason_code="policy_changed",
                changes={"policy_version": policy.version},
            )
        return Decision(
            State.READY,
            Trigger.PROCEED,
            progress,
            reason=f"{note} (immaterial for {kind.name})",
            reason_code="policy_changed_immaterial",
            changes={"policy_version": policy.version},
        )

    changed = []
    for ref in progress.evidence:
        try:
            record = evidence.fetch(ref.system, ref.record_id, tenant=task.tenant.slug)
        except evidence.EvidenceUnavailable as exc:
            return retry_later(task, kind, progress, now, code="evidence_unavailable", reason=str(exc))
        except evidence.EvidenceMissing as exc:
            return quarantine(progress, "evidence_missing", str(exc))
        except evidence.EvidenceUnstorable as exc:  # the record will say the same next time
            return quarantine(progress, "evidence_unstorable", str(exc))
        if record.version != ref.record_version:
            changed.append(f"{ref.system}/{ref.record_id} v{ref.record_version} -> v{record.version}")
    if changed:
        return Decision(
            State.READY,
            Trigger.REFRESH,
            replan_to,
            reason="evidence changed: " + ", ".join(changed),
            reason_code="evidence_changed",
        )
    checked = len(progress.evidence)
    return Decision(
        State.READY,
        Trigger.PROCEED,
        progress,
        reason_code="revalidated",
        reason=f"deadline, step, access, runtime config, policy and {checked} evidence records hold",
    )


def unknown_step(kind: registry.TaskType, name: str, progress: Progress) -> Decision:
    """Hold a task whose checkpoint names a step this deployment does not have; an agent's tool call
    whose tool was removed says so."""
    tool, mark, _ = name.partition(registry.CALL_MARK)
    if mark and kind.agent_runs:
        return quarantine(
            progress,
            "agent_tool_removed",
            f"the agent's call {name!r} is of tool {tool!r}, which {kind.name} no longer declares:"
            " nothing of it was sent; an operator decides what the task does",
        )
    return quarantine(progress, "unknown_step", f"step {name!r} is not part of {kind.name}")


def _approver_gone(task: Task, kind: registry.TaskType, progress: Progress, now: datetime) -> Decision | None:
    """An approval whose approver lost the role no longer authorizes anything: ask again."""
    for step, request in _in_force(task, kind, progress):
        approver = request.decision.decided_by
        if not has_role(approver, task.tenant_id, request.approver_role):
            why = f"approver {approver} no longer holds the role"
            return _ask_again(task, kind, step, progress, now, why, "approver_access_revoked")
    return None


def _in_force(
    task: Task, kind: registry.TaskType, progress: Progress
) -> list[tuple[registry.RequestApproval, ApprovalRequest]]:
    """Each approval step whose newest request is approved and whose action has not run yet."""
    found = []
    for step in _approval_steps(task, kind):
        request = approvals.latest_request(task, step.name)
        if request is None or request.status != "approved":
            continue
        if any(call.step == step.action_step for call in progress.tool_calls):
            continue  # the approved action already ran
        found.append((step, request))
    return found


def _ask_again(
    task: Task,
    kind: registry.TaskType,
    step: registry.RequestApproval,
    progress: Progress,
    now: datetime,
    why: str,
    code: str,
) -> Decision:
    ask = approvals.request_decision(task, kind, step, progress, now=now, why=why)
    return Decision(
        State.WAITING_APPROVAL,
        Trigger.REAPPROVE,
        ask.progress,
        reason=ask.reason,
        reason_code=code,
        changes=ask.changes,
        records=ask.records,
        also=ask.also,
    )


def _agent_changed(task: Task, kind: registry.TaskType, progress: Progress, now: datetime) -> Decision | None:
    """An agent run whose model was retired, or whose tool set is not the one its turns were planned
    with (``toolsets``; the step records it on each turn as fact ``<run>:toolset``).

    - The model new turns would ask (``MODEL_BACKEND``, ``MODEL_NAME`` or the agent's own) is named
      by the type's ``RuntimeConfig`` rows and none of them approves it: quarantine
      (``agent_model_retired``). Not a replan: the deployment, not the task, chooses an agent's
      model, so a replan would ask the retired model again. Released once the deployment asks an
      approved one.
    - A tool the run already called is gone (the agent or its declaration no longer has it): its
      recorded turns cannot be replayed. Quarantine (``agent_tool_removed``): an operator decides.
    - Otherwise a changed tool set is a changed policy, and the type's ``on_policy_change`` says
      what it means: ``replan`` goes back to ``replan_step`` under the new tool set (an agent run
      then replays its records and asks its approvals again: an approval in force was given for
      the old tools); ``proceed`` asks again only the approvals still in force, else carries on.
      Either way the new tool set is recorded (``agent_toolset_changed``).
    """
    managed = RuntimeConfig.objects.filter(task_type=task.task_type)
    for run in kind.agent_runs:
        model = toolsets.model_id(run)
        named = managed.filter(model_id=model)
        if named.exists() and not named.filter(approved=True).exists():
            return quarantine(
                progress,
                "agent_model_retired",
                f"model {model} is no longer approved for {kind.name} and is the one this deployment"
                " asks: configure an approved model, then release the task",
            )
        recorded = progress.facts.get(toolsets.fact_name(run))
        current = toolsets.toolset_id(run)
        if not isinstance(recorded, str) or recorded == current:
            continue  # the run has not taken a turn yet, or plans with the same tools
        usable = set(toolsets.agent_tools(run)) & {tool.tool for tool in run.tools}
        gone = sorted(toolsets.called_tools(progress.facts) - usable)
        if gone:
            return quarantine(
                progress,
                "agent_tool_removed",
                f"the agent already called {', '.join(gone)}, which {kind.name} no longer has: its"
                " recorded turns cannot be replayed; an operator decides what the task does",
            )
        note = f"{run.agent_name or run.name}'s tool set changed: {recorded} -> {current}"
        facts = {**progress.facts, toolsets.fact_name(run): current}
        renewed = progress.model_copy(update={"facts": facts})
        if kind.on_policy_change == "replan":
            return Decision(
                State.READY,
                Trigger.REPLAN,
                renewed.model_copy(update={"step": kind.replan_step or kind.first_step}),
                reason=note,
                reason_code="agent_toolset_changed",
            )
        for step, _ in _in_force(task, kind, progress):
            return _ask_again(task, kind, step, renewed, now, note, "agent_toolset_changed")
        return Decision(
            State.READY,
            Trigger.PROCEED,
            renewed,
            reason=f"{note} (no approval in force)",
            reason_code="agent_toolset_changed",
        )
    return None


def _approval_steps(task: Task, kind: registry.TaskType) -> list[registry.RequestApproval]:
    """The approval steps whose approvals may still be in force for ``task``: the type's own, then
    those made on demand (an agent's ``<tool>#<call>:approve``, ``AgentRun.call_steps``), found
    through the requests the task was asked, in the order they were first asked. A request whose
    step this code no longer resolves authorizes nothing here (``unknown_step`` holds such a task)."""
    steps = [step for step in kind.steps if isinstance(step, registry.RequestApproval)]
    named = {step.name for step in steps}
    asked = (
        ApprovalRequest.objects.filter(task=task)
        .exclude(step__in=named)
        .order_by("created_at", "id")
        .values_list("step", flat=True)
    )
    for name in dict.fromkeys(asked):  # each step once, first asked first
        found = kind.step(name)
        if isinstance(found, registry.RequestApproval):
            steps.append(found)
    return steps
