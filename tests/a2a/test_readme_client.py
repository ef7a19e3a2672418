"""The A2A client example of the docs (docs/building/a2a.md, once the README's), run as written against a
live server: a documented example that stops working fails here."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from a2a.types import a2a_pb2
from django.utils import timezone

from interop.models import A2AMessage
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tenancy.services import token_create
from tests.a2a.loop import run_async
from tests.conftest import make_user

PAGE = Path(__file__).resolve().parents[2] / "docs" / "building" / "a2a.md"


def the_example() -> str:
    text = PAGE.read_text()
    section = text[text.index("**A client in about twenty lines**") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.django_db(transaction=True)
def test_the_readme_client_starts_a_task_and_reads_it(live_server, settings, acme):
    settings.PUBLIC_BASE_URL = live_server.url
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
    user = make_user("readme-caller", acme, Role.INTEGRATOR)
    _, key = token_create(user, scopes="read,integrate", expires_at=timezone.now() + timedelta(days=1))
    example = the_example()
    assert len([line for line in example.splitlines() if line.strip()]) <= 30  # read at a glance
    namespace: dict = {"__name__": "readme_example"}  # not __main__: the printing part does not run
    exec(compile(example, str(PAGE), "exec"), namespace)

    task = run_async(namespace["start_refund"](live_server.url, key))

    assert task.status.state == a2a_pb2.TASK_STATE_WORKING and task.metadata["state"] == State.READY
    ours = Task.objects.get(pk=task.id)
    assert ours.tenant == acme and ours.task_type == "refund_request" and A2AMessage.objects.count() == 1
