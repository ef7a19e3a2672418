"""The agent's recorded turns, replayed: a turn that cannot be replayed holds the task, never loops it.

A step of an ``AgentRun`` hands the SDK back every turn the records hold. Should a record be one the
SDK refuses (its items garbled, or naming a tool the agent no longer has), or missing while a later
one is there, the task is quarantined with ``agent_turn_unreplayable`` and says which turn: retrying
cannot help, and asking the model again would be a second answer to a turn already committed.
"""

from __future__ import annotations

from typing import Any

import pytest

from audit import sealing
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from runtime import runner
from runtime.models import AgentTurn, ModelUsage
from runtime.sdk import replay
from tasks.models import Task
from tasks.states import State
from tests.runtime.payments import run
from tests.sdk.test_agent_refusals import last_reason, passes_change_nothing
from tests.sdk.test_support_agent import run_until_still, sandbox, support_task  # noqa: F401
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


def two_turns_in(tenant, monkeypatch) -> Task:
    """A support task one step at a time until the model's second turn (the refund) is recorded, with
    the refund's intent it committed with (decided from intact records: it is sent whatever follows)."""
    monkeypatch.setattr(runner, "MAX_STEPS", 1)
    task = support_task(tenant)
    for _ in range(10):
        if AgentTurn.objects.filter(task=task).count() == 2:
            monkeypatch.setattr(runner, "MAX_STEPS", 50)
            return Task.objects.get(pk=task.pk)
        task = run(task)
    raise AssertionError("the agent did not take two turns")


def _reseal(row: AgentTurn, value: Any) -> None:
    place = sealing.task_place(row.task_id, "agent_turns", row.step, row.turn)
    AgentTurn.objects.filter(pk=row.pk).update(response=sealing.seal(value, place))


def garbled_items(row: AgentTurn) -> None:
    _reseal(row, {"items": [{"type": "function_call", "name": "lookup_order"}], "usage": {"requests": 1}})


def a_tool_the_agent_lacks(row: AgentTurn) -> None:
    call = {"type": "function_call", "call_id": "call_1_wipe", "name": "wipe_order", "arguments": "{}"}
    _reseal(row, {"items": [call], "usage": {"requests": 1}})


def a_call_added_beside_the_recorded_one(row: AgentTurn) -> None:
    """The turn's own call kept as it was (its result still matches): only the records show the change."""
    items = list(_opened_items(row))
    items.append({"type": "function_call", "call_id": "call_9_wipe", "name": "wipe_order", "arguments": "{}"})
    _reseal(row, {"items": items, "usage": {"requests": 1}})


def _opened_items(row: AgentTurn) -> list[Any]:
    place = sealing.task_place(row.task_id, "agent_turns", row.step, row.turn)
    return list(sealing.open_envelope(row.response, place)["items"])


def no_items(row: AgentTurn) -> None:
    _reseal(row, ["not", "a", "turn"])


def deleted(row: AgentTurn) -> None:
    row.delete()


@pytest.mark.parametrize(
    "spoil", [garbled_items, a_tool_the_agent_lacks, a_call_added_beside_the_recorded_one, no_items, deleted]
)
def test_a_recorded_turn_that_cannot_be_replayed_quarantines_the_task_without_asking_the_model(
    acme, monkeypatch, spoil
):
    task = two_turns_in(acme, monkeypatch)
    spoil(AgentTurn.objects.get(task=task, turn=1))
    asked_before = ModelUsage.objects.filter(task=task).count()

    task = run_until_still(task)

    assert (task.state, task.state_reason) == (State.QUARANTINED, replay.UNREPLAYABLE)
    assert "turn 1" in last_reason(task)
    assert ModelUsage.objects.filter(task=task).count() == asked_before  # no turn asked again
    # The refund committed before the record was spoiled is sent once; nothing the run would do after
    # replaying the spoiled record (the e-mail) is.
    assert Effect.objects.filter(system="payments").count() == 1
    assert not Effect.objects.filter(system="email").exists()
    passes_change_nothing(task)


def test_the_reason_says_what_the_sdk_refused(acme, monkeypatch):
    task = two_turns_in(acme, monkeypatch)
    a_tool_the_agent_lacks(AgentTurn.objects.get(task=task, turn=1))

    task = run_until_still(task)

    assert task.state_reason == replay.UNREPLAYABLE
    assert "wipe_order" in last_reason(task)


# --- a run kept between steps (``replay._Live``) -----------------------------------------------------
#
# A worker keeps the SDK's run waiting where the records ended, and the next step goes on from there
# rather than replaying every turn again. It may only when nothing it was handed has changed: the
# tests above spoil a turn under a kept run (the run is dropped, the records decide); these check that
# a kept run ends as a replay would, and that it follows the agent as the code now has it.


def reason_codes(task: Task) -> list[str]:
    events = TransitionEvent.objects.filter(task=task).order_by("state_version")
    return list(events.values_list("reason_code", flat=True))


def test_a_run_kept_between_steps_commits_what_a_run_replayed_from_the_records_commits(acme, monkeypatch):
    monkeypatch.setattr(replay, "LIVE_RUNS_KEPT", 0)  # every step replays from the first message
    replayed = run_until_still(support_task(acme))
    monkeypatch.setattr(replay, "LIVE_RUNS_KEPT", 256)
    put_order("A-2", total="500.00")  # an order of its own: a second refund of A-1 would ask an approver
    kept = run_until_still(support_task(acme, order_id="A-2"))

    assert replayed.state == kept.state == State.COMPLETED
    assert reason_codes(kept) == reason_codes(replayed)
    turns = [row.turn for row in AgentTurn.objects.filter(task=kept).order_by("turn")]
    assert turns == [1, 2, 3, 4] and ModelUsage.objects.filter(task=kept).count() == 4


def test_a_turn_whose_commit_is_lost_is_asked_again_not_taken_from_the_kept_run(acme, monkeypatch):
    task = two_turns_in(acme, monkeypatch)
    AgentTurn.objects.filter(task=task, turn=2).delete()  # as if the step's commit had not happened

    task = run_until_still(task)

    assert task.state == State.COMPLETED, task.state_reason
    assert [row.turn for row in AgentTurn.objects.filter(task=task).order_by("turn")] == [1, 2, 3, 4]
    assert Effect.objects.filter(system="payments").count() == 1


def test_a_kept_run_follows_the_agent_as_the_code_has_it_now(acme, monkeypatch):
    from workflows.sdk.support import SUPPORT_AGENT, SupportModel

    class Counting(SupportModel):
        asked = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> Any:
            Counting.asked += 1
            return await super().get_response(*args, **kwargs)

    task = two_turns_in(acme, monkeypatch)
    monkeypatch.setattr(SUPPORT_AGENT, "model", Counting())  # a deployment's new model, same agent

    task = run_until_still(task)

    assert task.state == State.COMPLETED, task.state_reason
    assert Counting.asked == 2  # turns 3 and 4: the kept run, built with the old model, was dropped
