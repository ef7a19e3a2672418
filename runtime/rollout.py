"""Quarantines an older deployment put on keys it cannot compute: checked again, and lifted, by this one.

A deployment from before the ``INTENT`` key scheme (``ledger.keys``) computes
every effect key from the task's id. Meeting an unsettled action that this
deployment keyed in the ``INTENT`` scheme (a newer worker died after the intent,
or before it recorded the answer), it recomputes the key, finds another, and
quarantines the task as ``effect_changed_after_intent``. It sends nothing, which
is right: but the facts did not change, the scheme did, and nothing in the older
code would ever let the task go.

``lift_key_scheme_quarantines`` (a step of the sweep) takes each task of its
region quarantined for that reason whose action of the quarantined step is keyed
``INTENT`` and unsettled, and recomputes the key as this deployment's engine
does: in the action's own scheme (``tasks.effect_keys.scope_of``), from the
effect the quarantine's checkpoint (its step, its facts) gives. The stored key:
the task goes to ``resume_validation`` (``key_scheme_quarantine_lifted``, by the
sweep), where a worker of this deployment sends the action, or settles it, under
that key. Another key: the facts did change, and the quarantine stands for an
operator. An older worker that claims the task first quarantines it again, and
a later sweep lifts it again, until a newer worker has it (a rollout ends with
no older workers).

The reason and the facts are taken from the chain, not from the task row: the
event that put the task in quarantine must say ``effect_changed_after_intent``
and be keyed, and the checkpoint is read as a worker resumes from it (vouched
by a keyed event). The app role can rewrite ``Task.state_reason`` and insert
checkpoints and events, but cannot key one; trusting the row would let it
relabel a quarantine held for something else (a tampered effect or checkpoint,
which only an operator releases) and have the sweep lift it with a keyed event.
"""

from __future__ import annotations

import logging

from django.db.models import Exists, OuterRef

from audit.chain import link_problem
from audit.keys import chain_keys
from audit.models import TransitionEvent
from audit.verify import keyed_since
from ledger import integrity, keys
from ledger.models import SETTLED_OK, Action
from tasks import effect_keys, registry, services
from tasks.checkpoints import CheckpointUnreadable
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance

log = logging.getLogger(__name__)
LIFTER = Actor.system("sweep")
CHANGED_AFTER_INTENT = (
    "effect_changed_after_intent"  # the engine's reason (runtime.engine), the older one's too
)
LIFTED = "key_scheme_quarantine_lifted"


def lift_key_scheme_quarantines(region: str, batch: int) -> int:
    """Lift the quarantines of ``region`` an older deployment made over an ``INTENT`` key; how many."""
    unsettled_intent = Action.objects.filter(task=OuterRef("pk"), key_scheme=keys.Scheme.INTENT).exclude(
        dispatch_state__in=SETTLED_OK
    )
    quarantined = (
        Task.objects.filter(state=State.QUARANTINED, state_reason=CHANGED_AFTER_INTENT, region=region)
        .filter(Exists(unsettled_intent))
        .order_by("state_entered_at")[:batch]
    )
    lifted = 0
    for task in quarantined:
        key = _key_unchanged(task) if _held_for_the_key(task) else None
        if key is None:
            continue
        try:
            advance(
                task.id,
                task.state_version,
                State.RESUME_VALIDATION,
                actor=LIFTER,
                trigger=Trigger.DEPLOYMENT_CHANGED,
                reason=f"{key} is what the facts still give in its own key scheme: quarantined by an older"
                " deployment that keys effects by task id",
                reason_code=LIFTED,
            )
        except (StaleVersion, TransitionNotAllowed):
            continue  # moved by someone else since we read it (an operator's release, a cancel)
        lifted += 1
        log.info("key scheme quarantine lifted", extra={"task_id": str(task.id), "action": key})
    return lifted


def _held_for_the_key(task: Task) -> bool:
    """The chain agrees with the row: the event at the task's version quarantined it for
    ``CHANGED_AFTER_INTENT`` and was written with the chain key."""
    event = TransitionEvent.objects.filter(task_id=task.pk, state_version=task.state_version).first()
    return (
        event is not None
        and (event.to_state, event.trigger, event.reason_code)
        == (State.QUARANTINED, Trigger.QUARANTINE, CHANGED_AFTER_INTENT)
        and link_problem(event, chain_keys(), keyed_since) is None
    )


def _key_unchanged(task: Task) -> str | None:
    """The stored key of the quarantined step's action, if this deployment computes the same one."""
    try:
        checkpoint = services.latest_checkpoint(task, vouched=True)
        step = registry.get(task.task_type).step(checkpoint.step)
    except (CheckpointUnreadable, KeyError):
        return None
    if not isinstance(step, registry.Dispatch):
        return None
    action = Action.objects.filter(task=task, step=step.name).order_by("-id").first()
    if action is None or action.key_scheme != keys.Scheme.INTENT or action.dispatch_state in SETTLED_OK:
        return None
    digest = integrity.effect_digest(step.effect(dict(checkpoint.progress.facts)))
    expected = effect_keys.scope_of(task, action.key_scheme).key(step.name, digest)
    return action.idempotency_key if expected == action.idempotency_key else None
