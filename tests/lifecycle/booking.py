"""Throwaway task types whose effect a cancel leaves done, with the step that undoes it, and a
canceled task of them (the compensation tests: tests/lifecycle, tests/console)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from runtime import controls
from tasks import registry
from tasks.models import Task
from tasks.registry import Complete, Dispatch, Fail, RequestApproval, RequestInput, TaskType
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import put_order


class Trip(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = "Oslo"


BOOKING = TaskType(
    name="booking_with_undo",
    description="book a room, ask whether to keep it; a booking left behind is undone by unbook",
    input_model=Trip,
    steps=(
        Dispatch(
            "book",
            next="confirm",
            connector="payments",
            output="booking_ref",
            effect=lambda f: {"kind": "booking", "city": f["city"]},
        ),
        RequestInput("confirm", next="done", question="Keep the room?", answer="kept"),
        Complete("done", outcome=("booking_ref",)),
        Dispatch(
            "unbook",
            next="done",
            connector="tickets",
            output="unbooked_ref",
            compensates="book",
            effect=lambda f: {"kind": "booking.cancel", "booking": f["booking_ref"]},
        ),
    ),
)


# The same, but undoing a booking needs an approver's consent.
GUARDED = TaskType(
    name="booking_with_guarded_undo",
    description="book a room; undoing a booking left behind needs an approver",
    input_model=Trip,
    steps=(
        *BOOKING.steps[:3],
        RequestApproval(
            "approve_undo",
            next="done",
            action_step="unbook",
            on_rejected="kept",
            reason="Undoing a booking needs an approver.",
        ),
        Dispatch(
            "unbook",
            next="done",
            connector="tickets",
            output="unbooked_ref",
            compensates="book",
            approval="approve_undo",
            on_rejected="kept",
            effect=lambda f: {"kind": "booking.cancel", "booking": f["booking_ref"]},
        ),
        Fail("kept", reason="undo_declined"),
    ),
)


@pytest.fixture
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 1.0  # a first request to the live server can take a while
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1")


@pytest.fixture
def booking_types():
    for kind in (BOOKING, GUARDED):
        registry.register(kind)
    yield
    for kind in (BOOKING, GUARDED):
        registry._REGISTRY.pop(kind.name)  # a test's throwaway types


def canceled_booking(
    tenant, operator, kind: TaskType = BOOKING, stops_at: State = State.WAITING_INPUT
) -> Task:
    """A booking made, then the task canceled where it stopped (by default waiting for its question;
    ``outcome_unknown`` when the booking's answer never came): the booking stays done."""
    task = run(make_task(tenant, task_type=kind.name, objective="Book Oslo", input={"city": "Oslo"}))
    assert task.state == stops_at
    controls.task_control(
        task,
        "cancel",
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="trip called off",
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.CANCELED
    return task
