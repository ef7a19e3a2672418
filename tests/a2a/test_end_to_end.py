"""A2A end to end: the real a2a-sdk client over real HTTP to gunicorn, a real ``run_worker`` process,
the sandbox standing in for the order, ticket, payment and e-mail systems.

The whole life of a refund as another agent sees it: the card, the start, the customer's question
(``TASK_STATE_INPUT_REQUIRED``), the answer, the wait for one of our approvers (``TASK_STATE_WORKING``,
``needs_person``), decided by an approver who signed in with a password and a TOTP code and used our
REST API, then ``TASK_STATE_COMPLETED`` with the outcome artifact, every effect sent once. Then a
waiting task canceled to ``TASK_STATE_CANCELED`` by the worker, and ``ListTasks`` paged by the real
client. (tests/a2a/test_jsonrpc.py covers the same methods in process, without a worker.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.types import a2a_pb2
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.utils import timezone
from google.protobuf import json_format, struct_pb2

from audit.verify import verify_task
from demo.sandbox.models import Effect
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role
from tenancy.services import token_create
from tests.conftest import REFUND_INPUT, make_user
from tests.second_factor import code_for, device_for
from tests.workflow import ROOT, WorkerProcess, database_url, put_order, stop_all

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

TaskState = a2a_pb2.TaskState
QUESTION = "Which item was damaged?"  # workflows/refund_request.py, step ask_customer
FAST = {"CONNECTOR_TIMEOUT": "5", "MODEL_LATENCY_MS": "0", "LEDGER_LOOKUP_INTERVAL": "0.2"}


# --- the processes -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(transactional_db, tmp_path) -> Iterator[str]:
    """gunicorn serving the whole app (A2A, REST, the login pages, the sandbox) on the test database;
    the card names this server's own ``/a2a/`` (``PUBLIC_BASE_URL``)."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "PUBLIC_BASE_URL": base,
        "ALLOWED_HOSTS": "127.0.0.1",
        "CELERY_BROKER_URL": "memory://",  # the worker polls PostgreSQL; no doorbell leaves the process
        "LOG_LEVEL": "ERROR",
    }
    log_path = tmp_path / "gunicorn.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "config.wsgi:application", "--bind", f"127.0.0.1:{port}",
             "--workers", "1", "--threads", "8", "--worker-class", "gthread"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "gunicorn did not answer within 60 s"
                time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=20)


@pytest.fixture
def worker(server, tmp_path) -> Iterator[WorkerProcess]:
    started = WorkerProcess(f"{server}/sandbox", tmp_path, lease_ttl=5, extra_env=FAST)
    yield started
    stop_all([started])


# --- the caller: the real a2a-sdk client, driven from this (synchronous) test -------------------


def key_for(tenant, name: str) -> tuple[Any, str]:
    """An integrator (a calling system) and its API token (read + integrate, as the README says)."""
    user = make_user(name, tenant, Role.INTEGRATOR)
    _, key = token_create(user, scopes="read,integrate", expires_at=timezone.now() + timedelta(days=1))
    return user, key


class Caller:
    """Another agent: an ``httpx.AsyncClient`` with its bearer token, the card it fetched, and the
    a2a-sdk client built from that card, all on one event loop this test steps through."""

    def __init__(self, base: str, key: str):
        self.loop = asyncio.Runner()
        self.thread = ThreadPoolExecutor(1)
        self.http = httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=30)
        self.card = self.run(A2ACardResolver(self.http, base).get_agent_card())
        self.client = self.run(
            create_client(self.card, client_config=ClientConfig(httpx_client=self.http, streaming=False))
        )

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        # On a thread of its own: Playwright's sync API leaves an event loop running in the test thread
        # of a process that ran a browser test, and a Runner refuses to start inside a running loop.
        return self.thread.submit(self.loop.run, coroutine).result()

    def send(self, message: a2a_pb2.Message) -> a2a_pb2.Task:
        async def first() -> a2a_pb2.Task:
            events = [e async for e in self.client.send_message(a2a_pb2.SendMessageRequest(message=message))]
            return events[0].task

        return self.run(first())

    def get(self, task_id: str) -> a2a_pb2.Task:
        return self.run(self.client.get_task(a2a_pb2.GetTaskRequest(id=task_id)))

    def wait(self, task_id: str, done: Callable[[a2a_pb2.Task], bool], what: str, timeout: float = 60):
        """Poll ``GetTask`` as a caller without streams or push would, until ``done``."""
        deadline = time.monotonic() + timeout
        while True:
            task = self.get(task_id)
            if done(task):
                return task
            assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}; the task: {task}"
            time.sleep(0.2)

    def close(self) -> None:
        self.run(self.client.close())
        self.run(self.http.aclose())
        self.thread.submit(self.loop.close).result()
        self.thread.shutdown()


@pytest.fixture
def caller(server, acme) -> Iterator[tuple[Any, Caller]]:
    user, key = key_for(acme, "acme-agent")
    agent = Caller(server, key)
    yield user, agent
    agent.close()


def start_message(task_type: str, given: dict[str, Any]) -> a2a_pb2.Message:
    data = struct_pb2.Value()
    data.struct_value.update({"task_type": task_type, "input": given})
    return a2a_pb2.Message(
        message_id=f"start-{uuid.uuid4()}", role=a2a_pb2.ROLE_USER, parts=[a2a_pb2.Part(data=data)]
    )


def answer_message(task_id: str, text: str) -> a2a_pb2.Message:
    return a2a_pb2.Message(
        message_id=f"answer-{uuid.uuid4()}",
        task_id=task_id,
        role=a2a_pb2.ROLE_USER,
        parts=[a2a_pb2.Part(text=text)],
    )


def ours(task: a2a_pb2.Task) -> str:
    """Our exact state, from the status metadata every A2A task of ours carries."""
    return str(task.metadata["state"])


# --- the approver: a person with a password and an authenticator app, over HTTP ----------------


def signed_in_approver(base: str, user) -> httpx.Client:
    """An HTTP session through the real login form and the second-factor page (approvers are asked
    for a TOTP code after the password), ready to call the REST API with its CSRF token."""
    # The server hashes as deployed (PBKDF2); this process's tests hash with MD5 for speed.
    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode("pw", hasher.salt())
    user.save(update_fields=["password"])
    session = httpx.Client(base_url=base, timeout=30, follow_redirects=True)
    session.get("/accounts/login/")
    asked = session.post(
        "/accounts/login/",
        data={
            "username": user.username,
            "password": "pw",
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
    )
    assert asked.url.path == "/accounts/second-factor/", asked.url  # the password alone opens nothing
    assert session.get("/api/approvals/", params={"status": "pending"}).status_code == 403
    passed = session.post(
        "/accounts/second-factor/",
        data={"code": code_for(device_for(user)), "next": "/console/",
              "csrfmiddlewaretoken": session.cookies["csrftoken"]},
    )  # fmt: skip
    assert passed.url.path == "/console/approvals/", passed.url  # approvers land on their inbox
    session.headers["X-CSRFToken"] = session.cookies["csrftoken"]
    return session


# --- the tests ---------------------------------------------------------------------------------


def test_a_refund_over_a2a_asks_its_question_waits_for_our_approver_and_completes_with_each_effect_once(
    server, worker, caller, acme
):
    put_order("A-1")  # delivered, 100.00: the scripted triage refunds it
    agent_user, agent = caller
    approver = make_user("acme-approver", acme, Role.APPROVER)
    device_for(approver)

    # 1. The card: our endpoint on this server, a skill per task type, bearer tokens.
    assert agent.card.supported_interfaces[0].url == f"{server}/a2a/"
    assert agent.card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert "refund_request" in {skill.id for skill in agent.card.skills}

    # 2. Start: the worker reads the order, triages, and asks the caller its question.
    started = agent.send(start_message("refund_request", REFUND_INPUT))
    task_id = started.id
    assert started.status.state == TaskState.TASK_STATE_WORKING
    asked = agent.wait(
        task_id, lambda t: t.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, "the question"
    )
    assert ours(asked) == State.WAITING_INPUT
    assert asked.status.message.role == a2a_pb2.ROLE_AGENT
    assert [part.text for part in asked.status.message.parts] == [QUESTION]

    # 3. The answer (SendMessage with taskId): recorded at once, the task back in our hands.
    answered = agent.send(answer_message(task_id, "the left speaker"))
    assert answered.id == task_id and answered.status.state == TaskState.TASK_STATE_WORKING
    assert ours(answered) != State.WAITING_INPUT

    # 4. The warehouse's event (the calling system over REST): the item came back.
    agent.wait(task_id, lambda t: ours(t) == State.WAITING_EXTERNAL, "the wait for the return")
    returned = httpx.post(
        f"{server}/api/tasks/{task_id}/external-events/",
        json={
            "event_key": "return-1",
            "event_type": "shipment.returned",
            "payload": {"tracking_number": "TRK-9"},
        },
        headers={"Authorization": agent.http.headers["Authorization"]},
    )
    assert returned.status_code == 200 and returned.json()["applied"] is True, returned.text

    # 5. The approval: WORKING to the caller, a person must act, and nothing is sent meanwhile.
    waiting = agent.wait(task_id, lambda t: ours(t) == State.WAITING_APPROVAL, "the approval request")
    assert waiting.status.state == TaskState.TASK_STATE_WORKING
    assert waiting.metadata["needs_person"] is True
    assert not Effect.objects.filter(system__in=("tickets", "payments", "email")).exists()

    # 6. Our approver decides through the REST API, signed in with a password and a TOTP code.
    session = signed_in_approver(server, approver)
    try:
        inbox = session.get("/api/approvals/", params={"status": "pending"})
        assert inbox.status_code == 200, inbox.text
        [request] = [row for row in inbox.json()["results"] if str(row["task"]) == task_id]
        decided = session.post(
            f"/api/approvals/{request['id']}/decide/",
            json={"decision": "approve", "digest": request["digest"], "comment": "receipt checked"},
        )
        assert decided.status_code == 200 and decided.json()["applied"] is True, decided.text
    finally:
        session.close()

    # 7. Completed, with the outcome as its artifact (sensitive facts masked, as for any caller).
    done = agent.wait(task_id, lambda t: t.status.state == TaskState.TASK_STATE_COMPLETED, "completion")
    assert ours(done) == State.COMPLETED and done.metadata["needs_person"] is False
    [artifact] = done.artifacts
    outcome = json_format.MessageToDict(artifact.parts[0].data)
    assert artifact.artifact_id == "outcome"
    assert outcome["order_id"] == "A-1" and outcome["amount"] == "10.00"
    assert outcome["return_tracking"] == "TRK-9" and outcome["payment_ref"]
    assert outcome["damaged_item"] != "the left speaker"  # sensitive: masked in what callers read

    # 8. Each effect reached its system once (deliveries, not effects: the system's own dedupe
    # could hide a second send), the refund as approved, and the task's audit chain intact.
    sent = {effect.system: effect for effect in Effect.objects.all()}
    assert sorted(sent) == ["email", "payments", "tickets"]
    assert [effect.deliveries for effect in sent.values()] == [1, 1, 1]
    assert sent["payments"].request["amount"] == "10.00" and outcome["payment_ref"] == str(
        sent["payments"].pk
    )
    task = Task.objects.get(pk=task_id)
    assert task.owner == agent_user and verify_task(task) is None


def test_canceling_a_task_that_waits_for_the_caller_ends_it_canceled(server, worker, caller):
    put_order("A-1")
    _, agent = caller
    task_id = agent.send(start_message("refund_request", REFUND_INPUT)).id
    agent.wait(task_id, lambda t: t.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, "the question")

    asked = agent.run(agent.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id)))
    assert asked.status.state in (TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_CANCELED)

    canceled = agent.wait(task_id, lambda t: t.status.state == TaskState.TASK_STATE_CANCELED, "the cancel")
    assert ours(canceled) == State.CANCELED
    assert not Effect.objects.exists()
    with pytest.raises(Exception) as refused:  # a finished task: TaskNotCancelable
        agent.run(agent.client.cancel_task(a2a_pb2.CancelTaskRequest(id=task_id)))
    assert type(refused.value).__name__ == "TaskNotCancelableError", refused.value


def test_list_tasks_pages_through_more_tasks_than_a_page_holds(server, caller, globex):
    _, agent = caller
    started = [agent.send(start_message("order_lookup", {"order_id": f"L-{i}"})).id for i in range(5)]
    _, stranger = key_for(globex, "globex-agent")
    other = Caller(server, stranger)
    try:
        other.send(start_message("order_lookup", {"order_id": "G-1"}))  # another tenant's: never listed
    finally:
        other.close()

    pages: list[list[str]] = []
    token = ""
    while True:
        page = agent.run(agent.client.list_tasks(a2a_pb2.ListTasksRequest(page_size=2, page_token=token)))
        pages.append([task.id for task in page.tasks])
        assert page.total_size == 5 and page.page_size == 2
        token = page.next_page_token
        if not token:
            break
        assert len(pages) < 5, "the pages never end"
    assert [len(ids) for ids in pages] == [2, 2, 1]
    assert [task_id for ids in pages for task_id in ids] == list(
        reversed(started)
    )  # newest first, no repeats
