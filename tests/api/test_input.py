"""POST /api/tasks/<id>/input/: answering a task that waits for input.

A NUL or a lone surrogate anywhere in the answer (value or key) is a 400 naming where it
sits, and nothing is stored: before, a lone surrogate reached the database as a 500.
"""

from __future__ import annotations

import pytest

from tasks.models import Checkpoint, Task
from tasks.states import State
from tests.api.conftest import no_raise, post_raw, url, waiting_for_input
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db


POISONED_ANSWERS = {
    "nul": ('{"answer": "mug\\u0000"}', "payload.answer"),
    "surrogate": ('{"answer": "\\ud800"}', "payload.answer"),
    "surrogate-key": ('{"answer": "mug", "\\ud800": 1}', "payload"),
}


@pytest.mark.parametrize(("payload", "where"), POISONED_ANSWERS.values(), ids=POISONED_ANSWERS.keys())
def test_an_input_answer_that_cannot_be_stored_is_a_400_naming_where(operator, acme, payload, where):
    task = waiting_for_input(make_task(acme))
    raw = f'{{"expected_version": {task.state_version}, "payload": {payload}}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "input"), raw)
    assert response.status_code == 400
    [message] = response.json()["payload"]
    assert message.startswith(f"{where} ")
    assert Task.objects.get(pk=task.pk).state == State.WAITING_INPUT


def test_answering_a_task_whose_checkpoint_is_unreadable_is_a_409_not_a_500(acme, operator):
    task = waiting_for_input(make_task(acme))
    Checkpoint.objects.filter(task=task, state_version=task.state_version).update(body="garbage")
    response = api_client_for(operator).post(
        url(task, "input"),
        {"expected_version": task.state_version, "payload": {"answer": "x"}},
        format="json",
    )
    # Edited behind the application's back: refused on its digest before it is parsed.
    assert response.status_code == 409 and response.json()["code"] == "checkpoint_digest_mismatch"
