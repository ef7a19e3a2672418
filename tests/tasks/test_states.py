"""The transition table's own invariants."""

from __future__ import annotations

from tasks.states import NON_TERMINAL, TRANSITIONS, WAITING, State, Trigger, edges_from


def test_every_edge_names_who_may_take_it():
    assert all(edge.by for edge in TRANSITIONS)


def test_no_edge_is_listed_twice():
    keys = [(e.source, e.target, e.trigger) for e in TRANSITIONS]
    assert len(keys) == len(set(keys))


def test_every_wait_can_expire_and_be_left():
    for state in WAITING:
        triggers = {edge.trigger for edge in edges_from(state)}
        assert Trigger.WAIT_EXPIRED in triggers
        assert any(edge.target == State.RESUME_VALIDATION for edge in edges_from(state))


def test_every_non_terminal_state_can_be_escalated_and_canceled():
    for state in NON_TERMINAL:
        triggers = {edge.trigger for edge in edges_from(state)}
        assert Trigger.ESCALATE in triggers
        assert state == State.CANCEL_REQUESTED or Trigger.CANCEL in triggers
