"""The commit that ends a worker's run (``tasks.transitions``, ``tasks.hotpath.compare_and_set``).

On PostgreSQL the end's compare-and-set also answers the task's open cancel
requests and gives the worker's lease up, in the same statement and only if
the compare-and-set moved the row: a completed or canceled task still has its
requests closed, its lease is released, and a worker fenced off (its lease
taken over) changes nothing at all. The statements a run issues are counted
with ``CaptureQueriesContext``: one statement for the end, none after it.
In-process resume loops with a scripted model; no endpoint, no network.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pydantic import BaseModel

from runtime import runner
from runtime.heartbeats import Heartbeats
from runtime.llm import Reply
from tasks import cancellation, decisions, leases, registry, services
from tasks.exceptions import LeaseLost
from tasks.models import CancelRequest, CancelScope, Lease, Task
from tasks.registry import Complete, ModelTurn, TaskType
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
OPERATOR = Actor(ActorKind.OPERATOR, "user:op")


class Nothing(BaseModel):
    """The input of a type that needs none."""


ONE_TURN = TaskType(
    name="one_turn",
    description="one model turn, then done",
    input_model=Nothing,
    scripts={"think@1": lambda facts: "fine"},
    steps=(
        ModelTurn("think", next="done", prompt_id="think@1", output="thought"),
        Complete("done", outcome=("thought",)),
    ),
)


class Fine:
    model_id = "scripted"

    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
        return Reply("fine", self.model_id, 0, 0)


@pytest.fixture(autouse=True)
def one_turn():
    registry.register(ONE_TURN)
    yield ONE_TURN
    registry._REGISTRY.pop(ONE_TURN.name)  # a test's throwaway type


def start(acme) -> Task:
    return make_task(acme, task_type=ONE_TURN.name, objective="think once", input={})


def released(task: Task) -> bool:
    lease = Lease.objects.get(task=task)
    return lease.heartbeat_at == lease.expires_at and lease.expires_at <= timezone.now()


def statements_on(captured: CaptureQueriesContext, table: str) -> list[str]:
    return [q["sql"] for q in captured.captured_queries if q["sql"].startswith(f'UPDATE "{table}"')]


def test_a_completed_task_answers_its_open_request_and_gives_its_lease_up_in_the_end_statement(acme):
    task = start(acme)
    request, _ = cancellation.request_scoped(task, CancelScope.TOOL_CALL, actor=OPERATOR, reason="stop")
    with CaptureQueriesContext(connection) as captured:
        outcome = runner.run_task(task.id, worker_id="w", region="default", model=Fine())
    assert outcome == State.COMPLETED
    request.refresh_from_db()
    assert (request.status, request.resolution) == ("no_effect", "the task ended completed first")
    assert request.resolved_at is not None
    assert released(task)
    # No UPDATE of its own for either: both rode on the end's compare-and-set, and nothing after it
    # writes (the lease UPDATEs before it are the run's own heartbeats, one per step).
    assert statements_on(captured, CancelRequest._meta.db_table) == []
    sql = [q["sql"] for q in captured.captured_queries]
    writes = [statement for statement in sql if statement.startswith(("UPDATE", "INSERT", "WITH"))]
    end = max(i for i, sql in enumerate(writes) if sql.startswith("WITH moved AS (UPDATE"))
    assert writes[end + 1 :] == []  # its history rows too are in that statement


def test_a_canceled_task_applies_its_own_request_and_answers_the_others(acme):
    task = start(acme)
    turn, _ = cancellation.request_scoped(task, CancelScope.TOOL_CALL, actor=OPERATOR, reason="no calls")
    canceling = advance(
        task.id,
        task.state_version,
        State.CANCEL_REQUESTED,
        actor=OPERATOR,
        trigger=Trigger.CANCEL,
        reason_code="cancel:task",
        records=[
            cancellation.request_record(
                task, CancelScope.TASK, actor=OPERATOR, reason="not needed", at_version=task.state_version
            )
        ],
    )
    assert runner.run_task(canceling.id, worker_id="w", region="default", model=Fine()) == State.CANCELED
    own = CancelRequest.objects.get(task=task, scope=CancelScope.TASK)
    turn.refresh_from_db()
    assert (own.status, own.resolution) == ("applied", "the task was canceled")
    assert (turn.status, turn.resolution) == ("no_effect", "the task ended canceled first")
    assert released(task)


def test_a_fenced_workers_end_changes_nothing(acme):
    """The old holder's lease lapsed and another worker took the task over: its end is refused,
    and neither the cancel request nor the new holder's lease is touched."""
    task = start(acme)
    stale = leases.claim(task.id, worker_id="old", region="default", ttl=timedelta(seconds=-1))
    assert stale is not None
    current = leases.claim(task.id, worker_id="new", region="default")
    assert current is not None and current.token == stale.token + 1
    request, _ = cancellation.request_scoped(task, CancelScope.TOOL_CALL, actor=OPERATOR, reason="stop")
    before = Lease.objects.values().get(task=task)
    point = services.task_resume_point(task.id, actor=Actor.worker("old"))
    ending = decisions.Decision(State.COMPLETED, Trigger.COMPLETE, None, changes={"outcome": {}})
    with pytest.raises(LeaseLost):
        decisions.commit_read(point.task, ending, actor=Actor.worker("old"), lease=stale, release=True)
    assert Task.objects.get(pk=task.pk).state == State.READY
    assert Lease.objects.values().get(task=task) == before
    request.refresh_from_db()
    assert request.status == CancelRequest.Status.PENDING


def test_a_run_that_ends_issues_no_statement_after_its_end(acme):
    """The count of statements a one-turn task's run issues, claim to end (printed for the record)."""
    task = start(acme)
    with CaptureQueriesContext(connection) as captured:
        assert runner.run_task(task.id, worker_id="w", region="default", model=Fine()) == State.COMPLETED
    sql = [q["sql"] for q in captured.captured_queries if "SAVEPOINT" not in q["sql"]]
    print(f"\none_turn run (no heartbeat thread): {len(sql)} statements besides BEGIN/COMMIT")
    # Each commit is one statement: the turn's step (event, checkpoint, model usage) and the end
    # (event, checkpoint, anchor request, cancel requests answered, the lease released).
    assert sum(s.startswith("WITH moved AS") for s in sql) == 2
    assert not any(s.startswith("INSERT") for s in sql)
    assert sql[-1].startswith("WITH moved AS")  # nothing after the end's statement
    # The claim (with the task's row, its newest checkpoint and the event vouching for it), per step a
    # heartbeat and a cancel-request read, the two commits. 9 before the claim returned the checkpoint
    # and its event, read afterwards in two statements; 15 before each commit's history rows rode on
    # its compare-and-set; 18 before the claim became one statement and its row the first step's.
    assert len(sql) == 7


def test_a_slot_with_the_heartbeat_thread_stops_beating_before_its_end_gives_the_lease_up(acme, monkeypatch):
    """The heartbeat thread lets go of the lease before the end releases it: a beat landing after the
    end would otherwise find it gone and count a lease lost that was only given up."""
    task = start(acme)
    beats = Heartbeats(timedelta(seconds=30))
    held_at_end: list[bool] = []
    real_commit = decisions.commit_read

    def commit_read(task, decision, **kwargs):
        if kwargs.get("release"):
            held_at_end.append(task.id in beats._held)
        return real_commit(task, decision, **kwargs)

    monkeypatch.setattr(decisions, "commit_read", commit_read)
    try:
        outcome = runner.run_task(task.id, worker_id="w", region="default", model=Fine(), heartbeats=beats)
    finally:
        beats.stop()
    assert (outcome, held_at_end) == (State.COMPLETED, [False])
    assert released(task) and beats.beat() == set()  # nothing in hand, nothing lost


def test_a_task_changed_between_its_claim_and_its_first_step_is_not_advanced_from_the_claimed_row(acme):
    """The first step starts from the row the one-statement claim read; should the task move before
    that step commits (an operator quarantines it), the step's compare-and-set refuses the stale
    decision: nothing is written over the operator's move."""
    from audit.models import TransitionEvent

    task = start(acme)
    (held,) = leases.claim_next(worker_id="w", region="default")
    assert held.task is not None and held.task.state == State.READY
    moved = advance(
        task.id, held.task.state_version, State.QUARANTINED, actor=OPERATOR, trigger=Trigger.QUARANTINE,
        reason="held by an operator", reason_code="operator_hold",
    )  # fmt: skip
    events = TransitionEvent.objects.filter(task=task).count()

    outcome = runner.run_task(task.id, worker_id="w", region="default", model=Fine(), held=held)

    assert outcome != State.COMPLETED
    after = Task.objects.get(pk=task.id)
    assert (after.state, after.state_version) == (State.QUARANTINED, moved.state_version)
    assert TransitionEvent.objects.filter(task=task).count() == events
    assert released(task)
