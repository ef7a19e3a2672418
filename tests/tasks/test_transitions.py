"""The transition primitive on PostgreSQL: the table, the compare-and-set, atomicity."""

from __future__ import annotations

import threading
from collections import deque
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.utils import timezone

from audit.models import TransitionEvent
from ledger.models import Action
from tasks import hotpath, transitions
from tasks.exceptions import StaleVersion, TransitionNotAllowed
from tasks.models import Checkpoint, Task
from tasks.states import TERMINAL, TRANSITIONS, WAITING, ActorKind, Edge, State, allowed_pairs, edges_from
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db


def actor_for(edge: Edge) -> Actor:
    return Actor(min(edge.by), "tests")


def take(task: Task, edge: Edge) -> Task:
    extra = {"wait_deadline": timezone.now() + timedelta(hours=1)} if edge.target in WAITING else {}
    return advance(
        task.id,
        task.state_version,
        edge.target,
        actor=actor_for(edge),
        trigger=edge.trigger,
        progress=progress(f"to-{edge.target}"),
        **extra,
    )


def _paths() -> dict[State, list[Edge]]:
    """Shortest edge path from ``ready`` to every reachable state (read from the table)."""
    paths: dict[State, list[Edge]] = {State.READY: []}
    queue = deque([State.READY])
    while queue:
        state = queue.popleft()
        for edge in edges_from(state):
            if edge.target not in paths:
                paths[edge.target] = paths[state] + [edge]
                queue.append(edge.target)
    return paths


PATHS = _paths()


def task_in(state: State, tenant) -> Task:
    task = make_task(tenant)
    for edge in PATHS[state]:
        task = take(task, edge)
    assert task.state == state
    return task


def test_every_state_is_reachable_from_ready():
    assert set(PATHS) == set(State)


@pytest.mark.parametrize("edge", TRANSITIONS, ids=lambda e: f"{e.source}->{e.target}:{e.trigger}")
def test_every_edge_in_the_table_works(edge, acme):
    task = task_in(edge.source, acme)
    moved = take(task, edge)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (edge.target, task.state_version + 1)
    assert moved.state == edge.target
    event = TransitionEvent.objects.get(task=task, state_version=stored.state_version)
    assert (event.from_state, event.to_state, event.trigger) == (edge.source, edge.target, edge.trigger)


DISALLOWED = sorted((s, t) for s in State for t in State if (s, t) not in allowed_pairs())


@pytest.mark.parametrize("source,target", DISALLOWED, ids=lambda s: str(s))
def test_every_pair_missing_from_the_table_is_refused(source, target, acme):
    task = task_in(source, acme)
    for kind in ActorKind:
        with pytest.raises(TransitionNotAllowed):
            advance(
                task.id,
                task.state_version,
                target,
                actor=Actor(kind, "tests"),
                wait_deadline=timezone.now() + timedelta(hours=1),
            )
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (source, task.state_version)


def test_terminal_states_have_no_way_out():
    # Only audited self-loops: the amendment of a late-found effect, and a fork's record (tasks.forks).
    for state in TERMINAL:
        assert sorted((e.target, e.trigger) for e in edges_from(state)) == [
            (state, "fork"),
            (state, "late_effect_found"),
        ]


def test_an_edge_is_refused_to_an_actor_kind_it_does_not_list(acme):
    task = make_task(acme)
    with pytest.raises(TransitionNotAllowed):  # completing is a worker's move, not an operator's
        advance(task.id, 1, State.COMPLETED, actor=Actor(ActorKind.OPERATOR, "op"))
    with pytest.raises(TransitionNotAllowed):  # cancel exists, but not by this trigger
        advance(task.id, 1, State.CANCEL_REQUESTED, actor=Actor(ActorKind.OPERATOR, "op"), trigger="complete")


def test_stale_version_is_refused_with_the_current_state(acme):
    task = make_task(acme)
    advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress())
    with pytest.raises(StaleVersion) as caught:
        advance(task.id, 1, State.COMPLETED, actor=Actor.worker("w"))
    assert (caught.value.state, caught.value.state_version) == (State.READY, 2)


def test_entering_a_wait_without_a_deadline_is_refused(acme):
    task = make_task(acme)
    with pytest.raises(ValueError, match="wait_deadline"):
        advance(task.id, 1, State.WAITING_INPUT, actor=Actor.worker("w"))
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_leaving_a_wait_clears_its_deadline(acme):
    task = task_in(State.WAITING_INPUT, acme)
    assert task.wait_deadline is not None
    task = advance(
        task.id, task.state_version, State.RESUME_VALIDATION, actor=Actor(ActorKind.INTEGRATOR, "i")
    )
    assert Task.objects.get(pk=task.pk).wait_deadline is None


def test_a_transition_writes_event_checkpoint_and_ledger_rows_together(acme):
    task = make_task(acme)
    effect = {"kind": "refund", "amount": "10.00"}
    moved = advance(
        task.id,
        1,
        State.READY,
        actor=Actor.worker("w"),
        progress=progress("dispatch"),
        actions=[ActionIntent(step="refund", connector="payments", effect=effect)],
    )
    assert Checkpoint.objects.filter(task=task, state_version=2).count() == 1
    assert TransitionEvent.objects.filter(task=task, state_version=2).count() == 1
    action = Action.objects.get(task=task)
    assert action.idempotency_key == ActionIntent("refund", "payments", effect).idempotency_key(task.id)
    assert action.dispatch_state == "intended"
    assert moved.audit_head == TransitionEvent.objects.get(task=task, state_version=2).hash


def test_a_failure_before_commit_leaves_no_trace(acme, monkeypatch):
    task = make_task(acme)
    real_write = transitions._write_history

    def write_then_crash(*args, **kwargs):
        real_write(*args, **kwargs)  # the update, event, checkpoint and actions are all written…
        raise RuntimeError("process died before COMMIT")  # …and the commit never happens

    monkeypatch.setattr(transitions, "_write_history", write_then_crash)
    # The commit of several statements in one transaction (SQLite's, and PostgreSQL's when the caller
    # writes too); the one-statement commit's own all-or-nothing: tests/tasks/test_step_commit.py.
    monkeypatch.setattr(hotpath, "folds", lambda: False)
    with pytest.raises(RuntimeError):
        advance(
            task.id,
            1,
            State.READY,
            actor=Actor.worker("w"),
            progress=progress(),
            actions=[ActionIntent(step="refund", connector="payments", effect={"amount": "1"})],
        )
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state_version, stored.audit_head) == (1, task.audit_head)
    assert TransitionEvent.objects.filter(task=task).count() == 1  # only the creation event
    assert Checkpoint.objects.filter(task=task).count() == 1  # only the first checkpoint
    assert not Action.objects.filter(task=task).exists()


@pytest.mark.django_db(transaction=True)
def test_sixteen_racing_writers_one_commit(acme):
    task = make_task(acme)
    writers = 16
    barrier = threading.Barrier(writers)
    results: list[str] = []
    lock = threading.Lock()

    def race(n: int) -> None:
        try:
            barrier.wait()
            advance(task.id, 1, State.READY, actor=Actor.worker(f"w{n}"), progress=progress(f"by-{n}"))
            outcome = "committed"
        except StaleVersion:
            outcome = "stale"
        except Exception as exc:  # anything else is a failure of the primitive
            outcome = f"error: {exc!r}"
        finally:
            connections.close_all()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(results) == ["committed"] + ["stale"] * (writers - 1)
    assert Task.objects.get(pk=task.pk).state_version == 2
    assert TransitionEvent.objects.filter(task=task, state_version=2).count() == 1
    assert Checkpoint.objects.filter(task=task, state_version=2).count() == 1
    assert connection.vendor == "postgresql"


def test_a_transition_records_its_trace_in_the_event_and_the_checkpoint(acme, monkeypatch):
    from opentelemetry.sdk.trace import TracerProvider

    from tasks import services

    monkeypatch.setattr(transitions, "tracer", TracerProvider().get_tracer("tests"))
    task = make_task(acme)
    advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress("traced"))
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert len(event.trace_id) == 32 and int(event.trace_id, 16) != 0
    assert services.latest_checkpoint(task).trace_link.startswith(f"00-{event.trace_id}-")
