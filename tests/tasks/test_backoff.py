"""The one capped exponential backoff, and the retry waits of a task type that use it."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from tasks.backoff import capped_backoff
from tasks.registry import Complete, TaskType


class Nothing(BaseModel):
    """The input of a type that needs none."""


def kind(**policy: timedelta) -> TaskType:
    return TaskType(
        name="backoff_probe",
        description="a type to ask about its retry waits",
        input_model=Nothing,
        steps=(Complete("done"),),
        **policy,
    )


def test_the_backoff_doubles_per_try_from_its_base():
    assert [capped_backoff(5.0, n, 300.0) for n in range(5)] == [5.0, 10.0, 20.0, 40.0, 80.0]


def test_the_backoff_never_exceeds_its_cap():
    assert capped_backoff(5.0, 7, 300.0) == 300.0


def test_the_backoff_of_a_loop_that_counted_thousands_of_tries_is_the_cap_not_an_overflow():
    assert capped_backoff(0.1, 10_000, 2.0) == 2.0


def test_a_negative_count_of_doublings_is_the_base():
    assert capped_backoff(5.0, -1, 300.0) == 5.0


def test_a_task_types_retry_wait_doubles_per_attempt():
    waits = [kind(backoff=timedelta(seconds=5)).backoff_for(attempt) for attempt in (1, 2, 3)]
    assert waits == [timedelta(seconds=5), timedelta(seconds=10), timedelta(seconds=20)]


def test_a_task_types_retry_wait_stops_at_its_cap():
    capped = kind(backoff=timedelta(seconds=5), backoff_max=timedelta(seconds=30))
    assert capped.backoff_for(4) == capped.backoff_for(40) == timedelta(seconds=30)


def test_a_task_type_that_names_no_cap_waits_five_minutes_at_most():
    assert kind(backoff=timedelta(minutes=1)).backoff_for(20) == timedelta(minutes=5)
