"""Compensation runs: undoing an effect a canceled task left done, as a new action.

An effect cannot be unsent. A cancel's report (``runtime.engine``) lists what
the systems performed under ``effects_not_undone``, each with the compensating
step the task type offers (a ``Dispatch`` whose ``compensates`` names the
step). Taking an offer starts a *compensation run*: a new task of the same
type, tenant, owner, region and input, whose first step is the compensating
one and whose facts are the canceled task's last ones (with the undone
effect's reference as its step's output). The run's effect is a new ledger
action — its own idempotency key, evidence and approval where the step asks
for one — whose ``compensation_of`` is the action it undoes, and the run ends
with that step: ``completed`` once the system performed it, ``failed`` when
it refused or an approver did.

The canceled task is never written; the run links to it by ``rerun_of`` (so
retention keeps it while the run stays). The run's own idempotency key is
derived from the action it undoes, so asking twice (a double click, two
operators) starts one run. Two reserved facts mark a run: ``FACT_ACTION`` (the undone
action's key) and ``FACT_STEP`` (the compensating step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from ledger.models import SETTLED_OK, Action
from tasks import registry, sealing, services
from tasks.checkpoints import CheckpointUnreadable, Scalar
from tasks.exceptions import TransitionError
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor

FACT_ACTION = "compensation_of"
FACT_STEP = "compensation_step"


class NotCompensable(TransitionError):
    """Nothing was started: the task, the action or the task type offers no such compensation."""

    code = "not_compensable"


@dataclass(frozen=True)
class Offer:
    """One effect a canceled task left done, the step that would undo it, and its run if started."""

    action: Action
    step: str  # the compensating step
    run: Task | None


RUN_KEY_PREFIX = "compensate:action-"


def run_key(action: Action) -> str:
    """The run's task idempotency key: one run per undone action, however often it is asked for."""
    return f"{RUN_KEY_PREFIX}{action.pk}"


def _offered_steps(task_type: str) -> dict[str, str]:
    """Compensated step -> the step of ``task_type`` that undoes it."""
    kind = registry.get(task_type)
    return {
        step.compensates: step.name
        for step in kind.steps
        if isinstance(step, registry.Dispatch) and step.compensates
    }


def offers(task: Task) -> list[Offer]:
    """What the cancel report of ``task`` offers to undo, each with its run when one was started.

    Empty unless ``task`` was canceled. Effects the task undid itself, or whose
    type offers no compensating step, are not offered.
    """
    if task.state != State.CANCELED or not isinstance(task.outcome, dict):
        return []
    keys = [item.get("action") for item in task.outcome.get("effects_not_undone", [])]
    steps = _offered_steps(task.task_type)
    actions = [
        a
        for a in Action.objects.filter(task=task, idempotency_key__in=keys).order_by("id")
        if a.step in steps and a.dispatch_state in SETTLED_OK
    ]
    runs = {t.idempotency_key: t for t in Task.objects.filter(rerun_of=task, tenant_id=task.tenant_id)}
    return [Offer(a, steps[a.step], runs.get(run_key(a))) for a in actions]


def start(task: Task, action_key: str, *, actor: Actor, reason: str) -> tuple[Task, bool]:
    """Start the run that undoes ``action_key`` of canceled ``task``; ``(run, created)``.

    The same action again returns its run (``created=False``). Raises
    ``NotCompensable`` when ``task`` is not canceled, the report does not list
    the action, or its type offers no step to undo it; ``services.InvalidTaskInput``
    when the old input or checkpoint can no longer be read.
    """
    offer = next((o for o in offers(task) if o.action.idempotency_key == action_key), None)
    if offer is None:
        raise NotCompensable(_why_not(task, action_key), state=task.state, state_version=task.state_version)
    if offer.run is not None:
        return offer.run, False
    action = offer.action
    try:
        submitted = services.task_input(task)
        last = services.latest_checkpoint(task)
    except sealing.Unopenable as exc:
        raise services.InvalidTaskInput({"input": [f"{exc.where} cannot be read ({exc.problem})"]}) from None
    except CheckpointUnreadable as exc:
        raise services.InvalidTaskInput(
            {"checkpoint": [f"cannot be read ({exc.reason}: {exc.detail})"]}
        ) from None
    facts: dict[str, Scalar] = dict(last.facts)
    facts.pop(f"{offer.step}_rejected", None)  # the old task's own try at this step is not the run's
    undone = registry.get(task.task_type).step(action.step)
    if isinstance(undone, registry.Dispatch) and undone.output:
        # Settled by reconciliation while the cancel waited: the reference never became a fact.
        facts[undone.output] = action.external_ref
    facts[FACT_ACTION] = action.idempotency_key
    facts[FACT_STEP] = offer.step
    return services.task_create(
        tenant=task.tenant,
        task_type=task.task_type,
        objective=f"Undo {action.step} ({action.connector} {action.external_ref}) of canceled task {task.id}",
        input=submitted,
        actor=actor,
        owner=task.owner,
        idempotency_key=run_key(action),
        region=task.region,
        rerun_of=task,  # the link retention keeps: the canceled task stays while its run does
        reason=f"compensation of {action.idempotency_key} by {offer.step}: {reason}",
        first_step=offer.step,
        facts=facts,
    )


def _why_not(task: Task, action_key: str) -> str:
    if task.state != State.CANCELED:
        return f"only a canceled task's report offers compensation; this task is {task.state}"
    if not Action.objects.filter(task=task, idempotency_key=action_key).exists():
        return f"task {task.id} has no side effect {action_key!r}"
    return f"{action_key} is not offered for compensation (it was not done, was undone, or has no undo step)"


def undone_action(task: Task, step: registry.Dispatch, facts: dict[str, Any]) -> Action | None:
    """The action a compensating ``step`` of ``task`` undoes: the run's, or the task's own latest."""
    if facts.get(FACT_STEP) == step.name and facts.get(FACT_ACTION):
        return Action.objects.filter(
            idempotency_key=facts[FACT_ACTION], task__tenant_id=task.tenant_id
        ).first()
    return Action.objects.filter(task=task, step=step.compensates).order_by("-id").first()


def reruns(task: Task) -> QuerySet[Task]:
    """The tasks started to run ``task`` again, oldest first: its compensation runs are listed with
    its effects (``offers``), not as reruns, although they link to it the same way."""
    return (
        Task.objects.filter(rerun_of=task).exclude(idempotency_key__startswith=RUN_KEY_PREFIX).order_by("id")
    )


def undone_by(run: Task) -> Action | None:
    """For a compensation run: the action of the canceled task it undoes (None for any other task)."""
    pk = (run.idempotency_key or "").removeprefix(RUN_KEY_PREFIX)
    if run.rerun_of_id is None or pk == run.idempotency_key or not pk.isdigit():
        return None
    return Action.objects.filter(pk=int(pk), task_id=run.rerun_of_id).first()
