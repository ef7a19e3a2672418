"""A2A v1.0 streams (SendStreamingMessage, SubscribeToTask) with the real a2a-sdk client, over a real HTTP
server: each status change of a task arrives as it happens, in order, from the transition log, and a
dropped stream resumes with ``Last-Event-ID`` without loss or repeat.

The client runs against pytest-django's live server (a threaded WSGI server that sends each chunk as it
is written); raw SSE is read once from gunicorn with the production ``gthread`` configuration and once
from uvicorn serving the ASGI application. httpx's in-process ASGI transport collects a whole body before
returning it, so it serves only the checks where the stream ends by itself (a finished task, a refusal).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import pytest
from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.types import a2a_pb2
from django.db import connection
from django.utils import timezone

from a2a_api import stream
from a2a_api.rpc import error_metadata
from tasks.models import Task
from tasks.services import seal_outcome
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import ApiToken
from tenancy.services import token_revoke
from tests.a2a.loop import run_async
from tests.a2a.test_jsonrpc import BASE, data_message, key_for, rpc
from tests.conftest import REFUND_INPUT, make_task, progress
from tests.workflow import ROOT, database_url, sessions_named

WORKER = Actor.worker("w-stream")
SYSTEM = Actor.system("stream-test")
WAIT = timedelta(hours=1)
START = {"task_type": "refund_request", "input": REFUND_INPUT}


@pytest.fixture
def live(live_server, settings):
    """The live server's URL, named by the card as the endpoint; streams poll often."""
    settings.PUBLIC_BASE_URL = live_server.url
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
    settings.A2A_STREAM_POLL_SECONDS = 0.05
    return live_server.url


@pytest.fixture
def in_process(settings):
    settings.PUBLIC_BASE_URL = BASE
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.A2A_STREAM_POLL_SECONDS = 0.05


def move(task_id, to_state: str, *, actor: Actor = WORKER, **options) -> Task:
    """One real transition of the task from the version it is at now (the kernel's one writer)."""
    task = Task.objects.get(pk=task_id)
    if to_state == State.COMPLETED:
        options.setdefault("outcome", seal_outcome(task, {"order_id": "A-1", "payment_ref": "P-7"}))
    return advance(task.id, task.state_version, to_state, actor=actor, **options)


# Transitions run in the test's thread, inside the client's event loop (the server is another thread or
# process): each is committed before the client reads on.
# A life after ``ready`` v1: v2 … v6, each a real edge of the transition table.
LIFE = [
    lambda t: move(t, State.READY, progress=progress("triage")),
    lambda t: move(t, State.WAITING_EXTERNAL, progress=progress("await_return"),
                   wait_deadline=timezone.now() + WAIT),
    lambda t: move(t, State.RESUME_VALIDATION, actor=SYSTEM, trigger=Trigger.EXTERNAL_EVENT),
    lambda t: move(t, State.READY, trigger=Trigger.PROCEED),
    lambda t: move(t, State.COMPLETED, progress=progress("done")),
]  # fmt: skip


async def streaming(base: str, key: str, body, *, transport: httpx.AsyncBaseTransport | None = None):
    async with httpx.AsyncClient(
        base_url=base, transport=transport, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as http:
        client = await create_client(base, client_config=ClientConfig(httpx_client=http, streaming=True))
        try:
            return await body(client)  # a stream that holds its events back times out reading (30 s)
        finally:
            connection.close()  # the transitions made inside this event loop had a connection of their own


def resume_from(version: int) -> ClientCallContext:
    return ClientCallContext(service_parameters={"Last-Event-ID": str(version)})


def seen(event: a2a_pb2.StreamResponse) -> tuple[str, int, str]:
    """(kind, state_version, our state) of one stream event."""
    kind = event.WhichOneof("payload")
    if kind == "task":
        return kind, int(event.task.metadata["state_version"]), event.task.metadata["state"]
    if kind == "status_update":
        update = event.status_update
        return kind, int(update.metadata["state_version"]), update.metadata["state"]
    return kind, -1, event.artifact_update.artifact.artifact_id


@pytest.mark.django_db(transaction=True)
def test_a_subscription_receives_every_status_change_in_order_as_the_task_moves(live, acme):
    key = key_for(acme)
    task = make_task(acme)

    async def follow(client):
        got = []
        async for event in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id))):
            got.append(event)
            if event.HasField("task") or event.HasField("status_update"):
                # The next transition happens only once this one arrived: a stream that held its
                # events back (a buffering server) would never get here and time out.
                done = len([e for e in got if not e.HasField("artifact_update")]) - 1
                if done < len(LIFE):
                    LIFE[done](task.id)
        return got

    got = run_async(streaming(live, key, follow))
    assert [seen(e) for e in got] == [
        ("task", 1, State.READY),
        ("status_update", 2, State.READY),
        ("status_update", 3, State.WAITING_EXTERNAL),
        ("status_update", 4, State.RESUME_VALIDATION),
        ("status_update", 5, State.READY),
        ("artifact_update", -1, "outcome"),
        ("status_update", 6, State.COMPLETED),
    ]
    final = got[-1].status_update
    assert final.status.state == a2a_pb2.TASK_STATE_COMPLETED and final.task_id == str(task.id)
    assert got[3].status_update.status.state == a2a_pb2.TASK_STATE_WORKING  # resume_validation reads WORKING
    outcome = got[-2].artifact_update.artifact.parts[0].data.struct_value
    assert outcome["order_id"] == "A-1"


@pytest.mark.django_db(transaction=True)
def test_a_dropped_stream_resumes_after_its_last_event_id_without_loss_or_repeat(live, acme):
    key = key_for(acme)
    task = make_task(acme)

    async def first_connection(client):
        versions = []
        async for event in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id))):
            versions.append(seen(event)[1])
            if len(versions) < 3:
                LIFE[len(versions) - 1](task.id)
            else:
                break  # the connection drops here, with v3 seen
        return versions

    before = run_async(streaming(live, key, first_connection))
    assert before == [1, 2, 3]
    for transition in LIFE[2:4]:  # v4, v5 happen while nobody listens
        transition(task.id)

    async def resumed(client):
        got = []
        stream = client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id)), context=resume_from(3))
        async for event in stream:
            got.append(seen(event))
            if got[-1][:2] == ("status_update", 5):
                LIFE[4](task.id)  # v6: completed, live
        return got

    after = run_async(streaming(live, key, resumed))
    assert after == [
        ("status_update", 4, State.RESUME_VALIDATION),
        ("status_update", 5, State.READY),
        ("artifact_update", -1, "outcome"),
        ("status_update", 6, State.COMPLETED),
    ]  # no snapshot on a resume: exactly the events after v3

    async def once_more(client):  # resuming after the final event: nothing left, and it ends
        stream = client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id)), context=resume_from(6))
        return [seen(event) async for event in stream]

    assert run_async(streaming(live, key, once_more)) == []


@pytest.mark.django_db(transaction=True)
def test_a_token_revoked_mid_stream_gets_no_further_event(live, acme):
    key = key_for(acme)
    task = make_task(acme)

    async def follow(client):
        got = []
        with pytest.raises(Exception) as ended:
            async for event in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id))):
                got.append(seen(event))
                token_revoke(ApiToken.objects.get())
                LIFE[0](task.id)  # v2 happens after the revocation: it must not reach this caller
        return got, type(ended.value).__name__

    got, error = run_async(streaming(live, key, follow))
    assert got == [("task", 1, State.READY)] and error == "TaskNotFoundError"


@pytest.mark.django_db(transaction=True)
def test_a_stream_ends_at_its_time_limit_and_the_client_resubscribes(live, acme, settings):
    settings.A2A_STREAM_MAX_SECONDS = 0.5
    key = key_for(acme)
    task = make_task(acme)

    async def quiet(client):
        started = time.monotonic()
        got = [seen(e) async for e in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id)))]
        return got, time.monotonic() - started

    got, lasted = run_async(streaming(live, key, quiet))
    assert got == [("task", 1, State.READY)] and lasted < 10  # ended although the task did not


@pytest.mark.django_db(transaction=True)
def test_send_streaming_message_starts_once_streams_until_input_is_required_and_the_answer_streams_on(
    live, acme
):
    key = key_for(acme)

    async def start(client):
        got = []
        request = a2a_pb2.SendMessageRequest(message=data_message("s-1", START))
        async for event in client.send_message(request):
            got.append(event)
            task_id = got[0].task.id
            if len(got) == 1:
                move(task_id, State.READY, progress=progress("triage"))
            elif len(got) == 2:
                move(
                    task_id, State.WAITING_INPUT, progress=progress("ask_customer"),
                    reason="Which item was damaged?", wait_deadline=timezone.now() + WAIT,
                )  # fmt: skip
        again = [e async for e in client.send_message(request)]  # the same messageId: the same task
        return got, again

    got, again = run_async(streaming(live, key, start))
    assert Task.objects.count() == 1
    task = Task.objects.get()
    assert [seen(e) for e in got] == [
        ("task", 1, State.READY),
        ("status_update", 2, State.READY),
        ("status_update", 3, State.WAITING_INPUT),
    ]  # ended: the task waits for the caller
    asked = got[-1].status_update.status
    assert asked.state == a2a_pb2.TASK_STATE_INPUT_REQUIRED
    assert asked.message.parts[0].text == "Which item was damaged?"
    assert [seen(e) for e in again] == [("task", 3, State.WAITING_INPUT)]

    async def answer(client):
        got = []
        text = [a2a_pb2.Part(text="the lid")]
        message = a2a_pb2.Message(message_id="s-2", task_id=str(task.id), role=a2a_pb2.ROLE_USER, parts=text)
        async for event in client.send_message(a2a_pb2.SendMessageRequest(message=message)):
            got.append(seen(event))
            if len(got) == 1:
                move(task.id, State.READY, trigger=Trigger.PROCEED)
            elif got[-1][1] == 5:
                move(task.id, State.COMPLETED, progress=progress("done"))
        return got

    assert run_async(streaming(live, key, answer)) == [
        ("task", 4, State.RESUME_VALIDATION),
        ("status_update", 5, State.READY),
        ("artifact_update", -1, "outcome"),
        ("status_update", 6, State.COMPLETED),
    ]


@pytest.mark.django_db(transaction=True)
def test_subscribing_to_a_finished_task_answers_its_final_status_and_ends(in_process, acme):
    key = key_for(acme)
    task = make_task(acme)
    for transition in LIFE:
        transition(task.id)

    async def subscribe(client):
        return [e async for e in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id)))]

    from config.asgi import application

    got = run_async(streaming(BASE, key, subscribe, transport=httpx.ASGITransport(app=application)))
    assert len(got) == 1 and got[0].HasField("task")
    final = got[0].task
    assert final.status.state == a2a_pb2.TASK_STATE_COMPLETED and final.metadata["state_version"] == 6
    assert final.artifacts[0].parts[0].data.struct_value["order_id"] == "A-1"


@pytest.mark.django_db(transaction=True)
def test_another_tenants_task_is_not_found_and_nothing_streams(in_process, acme, globex):
    task = make_task(acme)
    stranger = key_for(globex, "stranger")

    async def subscribe(client):
        with pytest.raises(Exception) as refused:
            [e async for e in client.subscribe(a2a_pb2.SubscribeToTaskRequest(id=str(task.id)))]
        return type(refused.value).__name__

    from config.asgi import application

    transport = httpx.ASGITransport(app=application)
    assert run_async(streaming(BASE, stranger, subscribe, transport=transport)) == "TaskNotFoundError"


@pytest.mark.django_db(transaction=True)
def test_refusals_before_a_stream_are_plain_json_rpc_errors(client, in_process, acme, globex):
    key = key_for(acme)
    task = make_task(acme)
    params = {"id": str(task.id)}

    nobody = client.post(
        "/a2a/",
        json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": params}),
        content_type="application/json",
        headers={"A2A-Version": "1.0"},
    )
    assert nobody.status_code == 401 and nobody["Content-Type"] == "application/json"
    assert nobody.json()["error"]["code"] == -32600

    for bad in ("seven", "-1", "99", "1" * 30):
        refused = rpc(client, key, "SubscribeToTask", params, headers={"Last-Event-ID": bad})
        assert refused["Content-Type"] == "application/json", bad
        error = refused.json()["error"]
        assert error["code"] == -32602 and error_metadata(error)["field"] == "Last-Event-ID"
    other = make_task(globex)
    foreign = {"message": {"messageId": "x-1", "taskId": str(other.id), "role": "ROLE_USER",
                           "parts": [{"text": "an answer"}]}}  # fmt: skip
    assert rpc(client, key, "SendStreamingMessage", foreign).json()["error"]["code"] == -32001
    assert rpc(client, key, "SubscribeToTask", {"id": "not-a-uuid"}).json()["error"]["code"] == -32001


@pytest.mark.django_db(transaction=True)
def test_a_process_serves_at_most_its_stream_limit_and_answers_503_beyond(live, acme, settings, monkeypatch):
    settings.A2A_STREAM_MAX_OPEN = 1
    monkeypatch.setattr(stream, "HEARTBEAT_SECONDS", 0.2)  # the live server learns of a close by writing
    key = key_for(acme)
    task = make_task(acme)
    body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": str(task.id)}}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=live, headers=headers, timeout=30) as http:
        with http.stream("POST", "/a2a/", json=body) as first:
            assert first.headers["content-type"].startswith("text/event-stream")
            next(first.iter_lines())  # the snapshot arrived: this stream holds the process's one slot
            second = http.post("/a2a/", json=body)
            assert second.status_code == 503 and int(second.headers["Retry-After"]) >= 1
            assert second.json()["error"]["code"] == -32603
        move(task.id, State.READY, progress=progress("triage"))  # the first stream is gone: slot free
        deadline = time.monotonic() + 10
        while http.post("/a2a/", json={**body, "method": "GetTask"}).status_code == 200:
            with http.stream("POST", "/a2a/", json=body, headers={"Last-Event-ID": "2"}) as third:
                if third.status_code == 200:
                    assert third.headers["content-type"].startswith("text/event-stream")
                    break
            assert time.monotonic() < deadline, "the closed stream kept its slot"
            time.sleep(0.1)


# --- over real servers: gunicorn (production) and uvicorn (the ASGI application) --------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SERVERS = {
    "gunicorn": ["gunicorn", "-c", "deploy/gunicorn.conf.py", "config.wsgi:application"],
    "uvicorn": ["uvicorn", "config.asgi:application", "--log-level", "warning"],
}


@pytest.fixture(params=sorted(SERVERS))
def server(request, transactional_db, tmp_path):
    """gunicorn with deploy/gunicorn.conf.py (gthread), or uvicorn serving config.asgi, on a database URL
    naming its sessions."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),
        "DEBUG": "1",
        "SECRET_KEY": "stream-test-" + "x" * 40,
        "DATABASE_URL": f"{database_url()}?application_name=a2a-stream-test",
        "ALLOWED_HOSTS": "127.0.0.1",
        "PUBLIC_BASE_URL": base,
        "WEB_BIND": f"127.0.0.1:{port}",
        "WEB_WORKERS": "1",
        "WEB_GRACEFUL_TIMEOUT": "3",
        "WEB_TIMEOUT": "2",  # gthread: a stream may outlast it (the worker, not the request, is watched)
        "A2A_STREAM_POLL_SECONDS": "0.5",
        "A2A_STREAM_MAX_OPEN": "1",
        "LOG_LEVEL": "ERROR",
    }
    log_path = tmp_path / "server.log"
    command = SERVERS[request.param] + (["--port", str(port)] if request.param == "uvicorn" else [])
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", *command],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, log_path.read_text()[-3000:]
                try:
                    httpx.get(f"{base}/healthz", timeout=2)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, f"{request.param} did not answer within 60 s"
                    time.sleep(0.2)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=20)


def _frames(lines):
    """SSE frames from an iterator of lines: each a dict of its fields (``data`` parsed)."""
    frame: dict = {}
    for line in lines:
        if not line:
            if frame:
                yield frame
            frame = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            frame[name] = json.loads(value) if name == "data" else value


def test_over_a_real_server_each_event_is_delivered_as_it_happens_holding_no_database_session(server, acme):
    key = key_for(acme)
    task = make_task(acme)
    body = {"jsonrpc": "2.0", "id": "g-1", "method": "SubscribeToTask", "params": {"id": str(task.id)}}
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=server, headers=headers, timeout=30) as http:
        with http.stream("POST", "/a2a/", json=body) as response:
            assert response.status_code == 200
            assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
            frames = _frames(response.iter_lines())
            first = next(frames)  # before the task moves: the server wrote it without ending the response
            assert first["id"] == "1" and first["data"]["id"] == "g-1"
            assert first["data"]["result"]["task"]["metadata"]["state"] == State.READY

            # Between polls the stream holds no session (and so no transaction): sampled while it sleeps.
            idle = [sessions_named("a2a-stream-test") == 0 for _ in range(12) if not time.sleep(0.15)]
            assert sum(idle) >= 8, idle

            for transition in LIFE:
                transition(task.id)
                frame = next(frames)
                if "id" not in frame:  # the outcome artifact, then its completed status
                    assert frame["data"]["result"]["artifactUpdate"]["artifact"]["artifactId"] == "outcome"
                    frame = next(frames)
                update = frame["data"]["result"]["statusUpdate"]
                assert frame["id"] == str(int(update["metadata"]["state_version"]))
                assert update["metadata"]["state"] == Task.objects.get(pk=task.id).state
            assert frame["id"] == "6" and update["status"]["state"] == "TASK_STATE_COMPLETED"
            assert list(frames) == []  # and the response ended

        # A caller that hangs up frees its thread and slot at the stream's next poll: the server sees the
        # closed socket (gunicorn) or the disconnect (ASGI), well before heartbeats would fail to write.
        waiting = make_task(acme)
        body["params"]["id"] = str(waiting.id)
        with http.stream("POST", "/a2a/", json=body) as response:
            assert next(_frames(response.iter_lines()))["id"] == "1"
        hung_up = time.monotonic()
        while http.post("/a2a/", json={**body, "method": "GetTask"}).status_code == 200:
            with http.stream("POST", "/a2a/", json=body) as again:
                if again.status_code == 200:
                    break
            assert again.status_code == 503
            time.sleep(0.1)
        assert time.monotonic() - hung_up < 3.0  # two failed heartbeat writes alone would take 4 s
