"""An A2A answer and its messageId record commit together: a failure between them leaves neither.

Before, the answer committed in its own transition and the ``A2AMessage`` row followed in a second
transaction, so a crash between the two applied the answer without its idempotency record: the caller's
retry of the same messageId then read "not waiting for input" instead of its acknowledgement.
"""

from __future__ import annotations

import json

import pytest
from django.db import OperationalError

from interop.models import A2AMessage
from tasks.models import Task, TaskInput
from tasks.states import State
from tests.a2a.test_jsonrpc import BASE, key_for, rpc
from tests.api.conftest import waiting_for_input
from tests.conftest import make_task

# Transactional: the lost connection is answered as an outage (503), which closes the request's
# connections, as a real one must.
pytestmark = pytest.mark.django_db(transaction=True)


def answer(client, key, task: Task, message_id: str = "answer-1"):
    message = {"messageId": message_id, "taskId": str(task.id), "role": "ROLE_USER"}
    message["parts"] = [{"text": "mug"}]
    return rpc(client, key, "SendMessage", {"message": message})


def test_a_failed_record_leaves_the_answer_unapplied_and_the_retry_applies_it_once(
    client, settings, acme, monkeypatch
):
    settings.PUBLIC_BASE_URL, settings.ALLOWED_HOSTS = BASE, ["testserver"]
    key = key_for(acme)
    task = waiting_for_input(make_task(acme))

    def connection_lost(self, *args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    with monkeypatch.context() as patched:
        patched.setattr(A2AMessage, "save", connection_lost)
        failed = answer(client, key, task)
    assert failed.json()["error"]["code"] == -32603
    assert failed.status_code == 503 and failed["Retry-After"]  # an outage: the caller is told to retry
    task.refresh_from_db()
    assert task.state == State.WAITING_INPUT  # the answer went with its record
    assert not TaskInput.objects.filter(task=task).exists() and not A2AMessage.objects.exists()

    applied = answer(client, key, task).json()
    assert applied["result"]["task"]["metadata"]["state"] != State.WAITING_INPUT, json.dumps(applied)
    again = answer(client, key, task).json()  # the caller's retry of the same messageId: acknowledged
    assert again["result"]["task"]["id"] == str(task.id)
    assert TaskInput.objects.filter(task=task).count() == 1
    record = A2AMessage.objects.get()
    assert record.task_id == task.id and record.kind == A2AMessage.Kind.ANSWER
    task.refresh_from_db()
    assert task.state == State.RESUME_VALIDATION and task.state_version == 3
