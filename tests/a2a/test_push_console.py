"""The console's task page shows a task's A2A side: the client that started it and its context id, and each
push config's deliveries (target host, attempts, last status, next attempt), in one query, never the token."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from interop import push
from interop.models import PushDelivery
from reads.task_a2a import read_task_a2a
from tasks.models import Task
from tests.a2a.push_receiver import Receiver
from tests.a2a.test_jsonrpc import BASE, key_for, rpc
from tests.conftest import REFUND_INPUT, make_task

pytestmark = pytest.mark.django_db(transaction=True)
TOKEN = "page-must-not-show-this-token"


@pytest.fixture(autouse=True)
def a2a_settings(settings):
    settings.PUBLIC_BASE_URL = BASE
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.A2A_PUSH_ALLOWED_HOSTS = ["127.0.0.1"]
    settings.A2A_PUSH_BACKOFF_BASE = 60.0  # a failed attempt is retried in a minute: still pending here


def _started_over_a2a(client: Client, acme) -> Task:
    sent = rpc(client, key_for(acme), "SendMessage", {
        "message": {"messageId": "m-1", "role": "ROLE_USER", "contextId": "ctx-42",
                    "parts": [{"data": {"task_type": "refund_request", "input": REFUND_INPUT}}]},
    }, headers={"User-Agent": "other-agent/1.0"})  # fmt: skip
    return Task.objects.get(pk=sent.json()["result"]["task"]["id"])


def _page(user, task: Task) -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/console/tasks/{task.id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_task_page_shows_the_caller_and_each_configs_deliveries(client, acme, operator) -> None:
    task = _started_over_a2a(client, acme)
    failing = Receiver(always_fail=True).start()
    working = Receiver().start()
    try:
        push.configure(task, config_id="down", url=failing.url + "?secret=path", token=TOKEN)
        push.configure(task, config_id="up", url=working.url, token=TOKEN)
        push.deliver_due()
    finally:
        failing.stop()
        working.stop()
    page = _page(operator, task)
    section = page.split('id="a2a"', 1)[1].split("</section>", 1)[0]
    assert "Push deliveries" in section
    assert 'id="a2a-caller">caller' in section  # key_for's user
    assert "ctx-42" in section and "other-agent/1.0" in section
    port = failing.url.split(":")[2].split("/")[0]
    assert f"http://127.0.0.1:{port}" in section
    assert "secret=path" not in page and TOKEN not in page and "/hook" not in section
    rows = section.split('<tr class="push')[1:]
    down = next(row for row in rows if "<code>down</code>" in row)
    up = next(row for row in rows if "<code>up</code>" in row)
    assert "HTTP 500" in down and "pending" in down and ">1<" in down  # one attempt, retry scheduled
    assert PushDelivery.objects.get(config__config_id="down").next_attempt_at is not None
    assert "HTTP 200" in up and "delivered" in up


def test_a_task_nobody_reached_over_a2a_shows_no_a2a_section(acme, operator) -> None:
    assert 'id="a2a"' not in _page(operator, make_task(acme))


def test_the_read_is_one_query_however_many_configs_and_deliveries(client, acme, settings) -> None:
    settings.A2A_PUSH_BACKOFF_BASE, settings.A2A_PUSH_MAX_ATTEMPTS = 0.0, 3
    task = _started_over_a2a(client, acme)
    receiver = Receiver(always_fail=True).start()
    try:
        for n in range(4):
            push.configure(task, config_id=f"c{n}", url=receiver.url, token=TOKEN)
        push.deliver_due()  # three attempts each, at once (no backoff), then given up
    finally:
        receiver.stop()
    with CaptureQueriesContext(connection) as queries:
        shown = read_task_a2a(task)
    assert len(queries) == 1
    assert [p.config_id for p in shown.pushes] == ["c3", "c2", "c1", "c0"]
    assert {(p.attempts, p.status, p.failed) for p in shown.pushes} == {(3, "failed", 1)}
    assert shown.context_id == "ctx-42"
    assert json.dumps([p.target for p in shown.pushes]).count("127.0.0.1") == 4
