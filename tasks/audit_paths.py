"""What a task's audit chain may say: a path through the ONE transition table, and when to anchor it.

The chain's links (``audit.chain``) prove events were written with the chain
key; they cannot say whether the events make sense, and whoever holds the key
can write any event with a valid link — an "approved" after ``complete``, say.
``path_problem`` reads the events as a walk through ``tasks.states``:

- v1 is the creation, from nothing to ``ready`` by ``start`` (what
  ``tasks.transitions.task_start`` writes, and no edge of the table);
- every later event starts in the state the previous one ended in;
- its (from, to, trigger) is an edge of the table that its actor kind may take
  (``tasks.states.find_edge``, as ``advance`` checks before writing it);
- the task row's state is where the last event ended.

From these the rest follows, with nothing listed twice: after a terminal
state only the table's edges out of it may follow (today the self-loops
``late_effect_found`` and ``fork``, a fork's record on the task it resumes: retention archives
without an event, a confirmed cancel is the move *into* ``canceled``, reruns and compensations are
new tasks), and an approval decision needs a pending request before it (``approval_decided``
leaves only ``waiting_approval``, entered only by ``request_approval`` or
``reapprove``). The check lives here, above ``audit``, which knows no states;
``verify_chain`` hands it to ``audit.verify.verify_task``.

The chain is checked against today's table: removing an edge that old events
took makes them report. Keep an edge while history that took it exists.

Anchoring on demand: ``ring_after`` asks the anchor job for an anchor at its
next poll after a consequential commit (``ANCHOR_AFTER``, or any transition
committing an effect), by inserting an ``audit.models.AnchorRequest`` row in
the transition's own transaction: one small insert, on those transitions only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from audit.chain import BrokenLink
from audit.models import AnchorRequest, TransitionEvent
from audit.verify import UNKNOWN, verify_task
from tasks.states import TERMINAL, TRANSITIONS, ActorKind, State, Trigger, edges_from, find_edge

CREATION = ("", State.READY, Trigger.START)  # (from, to, trigger) of every v1 (``task_start``)
# Transitions after which the anchor job anchors at its next poll rather than at its interval: money
# decided (an approval), an outcome settled (completion, an effect found landed or reconciled).
# Any transition committing an effect (a ledger intent) rings too.
ANCHOR_AFTER = frozenset(
    {Trigger.APPROVAL_DECIDED, Trigger.COMPLETE, Trigger.RECONCILED, Trigger.LATE_EFFECT_FOUND}
)


def _state(name: str) -> State | None:
    try:
        return State(name)
    except ValueError:
        return None


def _refusal(event: TransitionEvent, source: State) -> str:
    """Why the table has no edge for ``event`` leaving ``source``, in the table's own words."""
    move = f"{event.actor_kind} {event.from_state} → {event.to_state} by {event.trigger}"
    if source in TERMINAL:
        allowed = sorted({edge.trigger.value for edge in edges_from(source)})
        return f"{move} after the task ended {source}: after it the table allows only {', '.join(allowed)}"
    sources = sorted({edge.source.value for edge in TRANSITIONS if edge.trigger == event.trigger})
    if sources and source.value not in sources:
        return f"{move}: {event.trigger} leaves only {', '.join(sources)} (nothing of the kind was pending)"
    return f"{move}: no such edge in the transition table"


def path_problem(
    task_id: Any, events: Sequence[TransitionEvent], state: str, after: TransitionEvent | None = None
) -> BrokenLink | None:
    """The first event of a linked chain that is not a valid step through the table, or None.

    ``events``: the task's events in version order (their links already verified);
    ``state``: the task row's state; ``after``: the already verified event they follow (the
    incremental check, ``audit.verify.verified_base``), None when they start at the creation.
    """
    previous: TransitionEvent | None = after
    for event in events:
        if event.actor_kind not in ActorKind.values:
            return BrokenLink(task_id, event.state_version, f"unknown actor kind {event.actor_kind!r}")
        if previous is None:
            if (event.from_state, event.to_state, event.trigger) != CREATION:
                return BrokenLink(
                    task_id,
                    event.state_version,
                    f"the first event is {event.from_state or '∅'} → {event.to_state} by {event.trigger}, "
                    "not the creation (∅ → ready by start)",
                )
        else:
            source, target = _state(event.from_state), _state(event.to_state)
            if event.from_state != previous.to_state:
                return BrokenLink(
                    task_id,
                    event.state_version,
                    f"starts in {event.from_state or '∅'}, but v{previous.state_version} ended in "
                    f"{previous.to_state}",
                )
            if source is None or target is None:
                return BrokenLink(
                    task_id, event.state_version, f"unknown state in {event.from_state} → {event.to_state}"
                )
            if find_edge(source, target, event.trigger, ActorKind(event.actor_kind)) is None:
                return BrokenLink(task_id, event.state_version, _refusal(event, source))
        previous = event
    if previous is not None and previous.to_state != state:
        return BrokenLink(task_id, None, f"task is {state}, its newest event ends in {previous.to_state}")
    return None


def verify_chain(
    task: Any, *, keyed: Any = UNKNOWN, since_verified: bool = False, remember: bool = False
) -> BrokenLink | None:
    """``audit.verify.verify_task`` with the path check: the whole of what ``verify_audit`` checks.

    ``since_verified``/``remember``: the console's incremental check (only events after the task's
    verified-through mark are hashed) and moving that mark on success (``audit.verify``).
    """
    return verify_task(task, path=path_problem, keyed=keyed, since_verified=since_verified, remember=remember)


def anchor_request(task: Any, trigger: str, actions: Collection[object]) -> AnchorRequest | None:
    """The (unsaved) request for an anchor soon, if this commit is consequential, else None: what
    ``ring_after`` inserts, for a transition that writes it in its own statement."""
    if trigger in ANCHOR_AFTER or actions:
        return AnchorRequest(requested_at=task.updated_at, reason=trigger, task_id=task.id)
    return None


def ring_after(task: Any, trigger: str, actions: Collection[object]) -> None:
    """Inside a transition's transaction: ask for an anchor soon if this commit is consequential."""
    request = anchor_request(task, trigger, actions)
    if request is not None:
        request.save(force_insert=True)
