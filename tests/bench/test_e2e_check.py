"""bench/e2e.py's check of each task's transitions: one run, or one run with the documented retries.

Under load a read of the evidence can fail (a reset connection); the task then waits in
``waiting_retry`` for the sweep and goes on. The check accepts exactly that detour and nothing
else: a step committed twice, another reason, another way back, or a chain with a gap fails.
Every transition in the crafted chains below is an edge of the state machine (checked first), so
they are chains a real task can have.
"""

from __future__ import annotations

import pytest

from bench.e2e import check_events
from tasks.states import TRANSITIONS

Event = tuple[int, str, str, str, str]

START = ("", "ready", "start", "")
READ = ("ready", "ready", "step", "")
TURN = ("ready", "ready", "step", "")
DONE = ("ready", "completed", "complete", "")
READ_FAILED = ("ready", "waiting_retry", "attempt_failed", "evidence_unavailable")
BACKOFF = ("waiting_retry", "resume_validation", "backoff_elapsed", "")
PROCEED = ("resume_validation", "ready", "proceed", "")
REFRESH = ("resume_validation", "ready", "refresh", "")
REREAD_FAILED = ("resume_validation", "waiting_retry", "attempt_failed", "evidence_unavailable")


def chain(*transitions: tuple[str, str, str, str]) -> list[Event]:
    return [(version, *transition) for version, transition in enumerate(transitions, start=1)]


def legal(events: list[Event]) -> bool:
    edges = {(e.source.value, e.target.value, e.trigger.value) for e in TRANSITIONS}
    return all(source == "" or (source, target, trigger) in edges for _, source, target, trigger, _ in events)


ACCEPTED = {
    "one run": chain(START, READ, TURN, DONE),
    "a failed read retried (the loaded run's 7 events)": chain(
        START, READ_FAILED, BACKOFF, PROCEED, READ, TURN, DONE
    ),
    "retried with the evidence read afresh": chain(START, READ_FAILED, BACKOFF, REFRESH, READ, TURN, DONE),
    "the read failing again on resume": chain(
        START, READ_FAILED, BACKOFF, REREAD_FAILED, BACKOFF, PROCEED, READ, TURN, DONE
    ),
    "two separate retries": chain(
        START, READ_FAILED, BACKOFF, PROCEED, READ_FAILED, BACKOFF, PROCEED, READ, TURN, DONE
    ),
}

REJECTED = {
    "a step committed twice": (chain(START, READ, READ, TURN, DONE), "a step committed twice"),
    "a retry that still committed a step twice": (
        chain(START, READ, READ_FAILED, BACKOFF, PROCEED, READ, TURN, DONE),
        "a step committed twice",
    ),
    "a step missing": (chain(START, READ, DONE), "expected"),
    "a retry for another reason": (
        chain(START, ("ready", "waiting_retry", "attempt_failed", "model_unavailable"), BACKOFF, PROCEED,
              READ, TURN, DONE),
        "not the documented retry",
    ),
    "a timed-out step": (
        chain(START, ("ready", "waiting_retry", "step_timed_out", "step_timeout"), BACKOFF, PROCEED, READ,
              TURN, DONE),
        "a step committed twice or another path",
    ),
    "an operator's retry instead of the backoff": (
        chain(START, READ_FAILED, ("waiting_retry", "resume_validation", "retry", ""), PROCEED, READ, TURN,
              DONE),
        "backoff_elapsed is",
    ),
    "a replan on resume (steps run again)": (
        chain(START, READ_FAILED, BACKOFF, ("resume_validation", "ready", "replan", ""), READ, TURN, DONE),
        "where the retry resumes",
    ),
    "ending in the retry": (chain(START, READ_FAILED, BACKOFF), "ends mid-retry"),
    "a gap in the versions": (
        [(1, *START), (2, *READ), (4, *TURN), (5, *DONE)],
        "not 1..4 in a row",
    ),
}  # fmt: skip


@pytest.mark.parametrize("events", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_one_run_and_the_documented_retries_are_accepted(events):
    assert legal(events)
    assert check_events(events) is None


@pytest.mark.parametrize(("events", "says"), REJECTED.values(), ids=REJECTED.keys())
def test_anything_else_is_refused_with_the_reason(events, says):
    problem = check_events(events)
    assert problem is not None and says in problem, problem


# The backlog run stops its workers after a number of completions: a task they left must be the
# beginning of its one run (``whole=False``), never a step twice, never past the end.
STOPPED_ACCEPTED = {
    "never claimed": chain(START),
    "stopped after the read": chain(START, READ),
    "stopped after the model's turn": chain(START, READ, TURN),
    "stopped waiting out the retry": chain(START, READ_FAILED, BACKOFF),
}
STOPPED_REJECTED = {
    "a step committed twice": chain(START, READ, READ, TURN),
    "ended (not stopped)": chain(START, READ, TURN, DONE),
    "a gap in the versions": [(1, *START), (3, *READ)],
}


@pytest.mark.parametrize("events", STOPPED_ACCEPTED.values(), ids=STOPPED_ACCEPTED.keys())
def test_a_task_the_stopped_workers_left_may_be_the_beginning_of_its_run(events):
    assert legal(events)
    assert check_events(events, whole=False) is None
    assert check_events(events) is not None  # not a whole run


@pytest.mark.parametrize("events", STOPPED_REJECTED.values(), ids=STOPPED_REJECTED.keys())
def test_a_stopped_task_with_anything_else_is_refused(events):
    assert check_events(events, whole=False) is not None
