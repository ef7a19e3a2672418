"""Compensation runs: undoing an effect a canceled task left done, as a new action.

An effect cannot be unsent. A cancel's report (``runtime.engine``) lists what
the systems performed under ``effects_not_undone``, each with the compensating
step the task type offers (a ``Dispatch`` whose ``compensates`` names the
step). Taking an offer starts a *compensation run*: a new task of the same
type, tenant, region and input, owned by the person who asked, whose first
step is the compensating one and whose facts are the canceled task's last ones
(with the undone effect's reference as its step's output). Its effect is a new
ledger action — its own idempotency key, evidence, and an approval where the
step asks for one — whose ``compensation_of`` is the action it undoes. When
that action's key is stable (scheme ``INTENT``: its task had a client key), the
run's keys derive from it and the run's number among its runs
(``tasks.effect_keys``), so a run started again after a restore lost it has
the same keys and the system does not undo twice. The run
ends with that step (``runtime.engine``): ``completed``, or ``failed`` when
the system or an approver refused it or its call was canceled.

The canceled task is never written. The run points at the action it undoes
(``Task.compensates``) and at the task (``rerun_of``, so retention keeps that
task while its run stays). One run at a time per action, and none once one
completed or its effect is done or in doubt: a double click or two operators
start one. A run that ended without undoing anything may be tried again.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import IntegrityError
from django.db.models import QuerySet

from audit import sealing
from ledger.models import IN_DOUBT, SETTLED_OK, Action
from tasks import registry, services
from tasks.checkpoints import CheckpointUnreadable, Scalar
from tasks.exceptions import TransitionError
from tasks.models import Archive, Task
from tasks.states import ENDED_UNDONE, ActorKind, State
from tasks.transitions import Actor


class NotCompensable(TransitionError):
    """Nothing was started: the task, the action or the task type offers no such compensation."""

    code = "not_compensable"


@dataclass(frozen=True)
class Offer:
    """One effect a canceled task left done, the step that would undo it, and what came of it."""

    action: Action
    step: str  # the compensating step
    run: Task | None  # the newest run, if one was started
    undo: str | None  # the dispatch state of the newest compensating action, if one was sent

    @property
    def open(self) -> bool:
        """A run may start: none yet, or the last ended without undoing (and nothing is in doubt)."""
        if self.undo in SETTLED_OK or self.undo in IN_DOUBT:
            return False
        return self.run is None or self.run.state in ENDED_UNDONE


def undo_steps(task_type: str) -> dict[str, str]:
    """Step -> the step of ``task_type`` that undoes it (none for a type no longer registered)."""
    if task_type not in registry.names():
        return {}
    return {
        step.compensates: step.name
        for step in registry.get(task_type).steps
        if isinstance(step, registry.Dispatch) and step.compensates
    }


def offers(task: Task) -> list[Offer]:
    """What the cancel report of ``task`` offers to undo, oldest effect first.

    Empty unless ``task`` was canceled and is not archived (archiving erased the
    sealed facts an undo may need). Effects the task undid itself, or whose type
    offers no compensating step, are not offered.
    """
    if task.state != State.CANCELED or not isinstance(task.outcome, dict):
        return []
    steps = undo_steps(task.task_type)
    if not steps or Archive.objects.filter(task=task).exists():
        return []
    keys = [item.get("action") for item in task.outcome.get("effects_not_undone", [])]
    actions = [
        a
        for a in Action.objects.filter(task=task, idempotency_key__in=keys).order_by("id")
        if a.step in steps and a.dispatch_state in SETTLED_OK
    ]
    runs = {run.compensates_id: run for run in Task.objects.filter(compensates__in=actions).order_by("id")}
    undos = dict(
        Action.objects.filter(compensation_of__in=actions)
        .order_by("id")
        .values_list("compensation_of_id", "dispatch_state")
    )
    return [Offer(a, steps[a.step], runs.get(a.pk), undos.get(a.pk)) for a in actions]


def start(task: Task, action_key: str, *, user: object, reason: str) -> tuple[Task, bool]:
    """Start the run that undoes ``action_key`` of canceled ``task`` as ``user``; ``(run, created)``.

    While a run is under way or once one completed, returns it (``created=False``).
    Raises ``NotCompensable`` when ``task`` is not canceled, the report does not
    offer the action, or its undo is done or in doubt already; and
    ``services.InvalidTaskInput`` when the old input or checkpoint can no longer be read.
    """
    offer = next((o for o in offers(task) if o.action.idempotency_key == action_key), None)
    if offer is None:
        raise NotCompensable(_why_not(task, action_key), state=task.state, state_version=task.state_version)
    if offer.run is not None and offer.run.state not in ENDED_UNDONE:
        return offer.run, False
    if not offer.open:
        raise NotCompensable(
            f"{action_key} has been undone already, or its undo is in doubt ({offer.undo})",
            state=task.state,
            state_version=task.state_version,
        )
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
    for mark in (f"{offer.step}_rejected", f"{offer.step}_canceled"):
        facts.pop(mark, None)  # the canceled task's own try at this step is not the run's
    undone = registry.get(task.task_type).step(action.step)
    if isinstance(undone, registry.Dispatch) and undone.output:
        # Settled by reconciliation while the cancel waited: the reference never became a fact.
        facts[undone.output] = action.external_ref
    try:
        run, _ = services.task_create(
            tenant=task.tenant,
            task_type=task.task_type,
            objective=f"Undo {action.step} ({action.connector} {action.external_ref}) of task {task.id}",
            input=submitted,
            actor=Actor.user(user, ActorKind.OPERATOR),
            owner=user,  # the one who asked: the run's approval is never theirs to give
            region=task.region,
            rerun_of=task,
            reason=f"{reason} (undoing {action.idempotency_key} with {offer.step})",
            first_step=offer.step,
            facts=facts,
            compensates=action,
        )
    except IntegrityError:  # another run of this action started meanwhile: that one is the answer
        return Task.objects.filter(compensates=action).exclude(state__in=ENDED_UNDONE).get(), False
    return run, True


def _why_not(task: Task, action_key: str) -> str:
    if task.state != State.CANCELED:
        return f"only a canceled task's report offers compensation; this task is {task.state}"
    if not Action.objects.filter(task=task, idempotency_key=action_key).exists():
        return f"task {task.id} has no side effect {action_key!r}"
    if Archive.objects.filter(task=task).exists():
        return f"task {task.id} is archived: the facts an undo would need were erased"
    return f"{action_key} is not offered for compensation (it was not done, was undone, or has no undo step)"


def reruns(task: Task) -> QuerySet[Task]:
    """The tasks started to run ``task`` again, oldest first: its compensation runs are listed with
    its effects (``offers``), not as reruns, although they link to it the same way."""
    return Task.objects.filter(rerun_of=task, compensates__isnull=True).order_by("id")
