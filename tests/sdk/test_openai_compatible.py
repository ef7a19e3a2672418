"""The support agent on an OpenAI-compatible server (``MODEL_BACKEND=openai``), over real sockets.

The server is a small chat-completions stand-in (``ChatServer``, ``http.server`` in a thread) that
answers ``POST /v1/chat/completions`` as a real one would: ``tool_calls`` with call ids, arguments as
JSON text, token counts in ``usage``; what it answers follows from the conversation it is sent, so
a replayed run and a fresh one see the same script. It can also fail on request (a 500, a 429, a
body that is not JSON, an answer slower than the step allows), which is how the retries, the
backoff and the redaction of what the failure said are tested. The sandbox answers the ledger's
calls on ``live_server``, as in ``test_support_agent``.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from agents import ModelRetrySettings, ModelSettings
from agents.retry import retry_policies
from django.db import connections

from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime import controls, runner, sweep
from runtime.heartbeats import Heartbeats
from runtime.models import AgentTurn, ModelUsage
from tasks import registry
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)

API_KEY = "sk-test-0123456789abcdefSECRET"
PRICE_IN, PRICE_OUT = Decimal("2.00"), Decimal("8.00")  # per million tokens
MODEL_ID = "openai-compatible:x"


# --- the stand-in server ---------------------------------------------------------------------------------


class ChatServer:
    """A chat-completions endpoint on 127.0.0.1 whose answers follow the support agent's task.

    ``faults`` holds what the next requests suffer, one entry each: ``"500"``, ``"429"``,
    ``"garbled"`` (200 with a body that is not JSON), ``("slow", seconds)`` (the right answer,
    late) or ``"no-usage"`` (the right answer, with no token counts). ``requests`` keeps every
    request: its path, its ``Authorization`` header, its body, and the usage answered (None for a
    failure)."""

    def __init__(self) -> None:
        self.faults: collections.deque[Any] = collections.deque()
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802  (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server.lock:
                    fault = server.faults.popleft() if server.faults else None
                    seen = {
                        "path": self.path,
                        "authorization": self.headers.get("Authorization"),
                        "body": body,
                    }
                    server.requests.append(seen)
                try:
                    server.answer(self, body, fault, seen)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up on a slow answer
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(
        self, handler: BaseHTTPRequestHandler, body: dict[str, Any], fault: Any, seen: dict[str, Any]
    ) -> None:
        seen["usage"] = None
        if handler.path != "/v1/chat/completions":
            return _send(handler, 404, {"error": {"message": f"no route {handler.path}"}})
        if fault == "500":
            # An upstream that quotes the caller's credentials back: the reason kept must not.
            said = f"upstream failed for {handler.headers.get('Authorization')}"
            return _send(handler, 500, {"error": {"message": said, "type": "server_error"}})
        if fault == "429":
            return _send(
                handler, 429, {"error": {"message": "rate limited", "type": "rate_limit"}}, retry_after="0"
            )
        if fault == "garbled":
            return _send_raw(handler, 200, b'{"id": "chatcmpl-1", "choices": [{"mess', "application/json")
        if isinstance(fault, tuple) and fault[0] == "slow":
            time.sleep(fault[1])
        message = next_move(body["messages"])
        usage = {
            "prompt_tokens": len(json.dumps(body)) // 4,
            "completion_tokens": len(json.dumps(message)) // 4,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        seen["usage"] = usage
        counted = {} if fault == "no-usage" else {"usage": usage}
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        _send(
            handler,
            200,
            {
                "id": f"chatcmpl-{len(self.requests)}",
                "object": "chat.completion",
                "created": 1_700_000_000,
                "model": body.get("model"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                **counted,
            },
        )

    def answered(self) -> list[dict[str, Any]]:
        return [seen for seen in self.requests if seen["usage"] is not None]


def _send(handler: BaseHTTPRequestHandler, status: int, payload: Any, retry_after: str = "") -> None:
    extra = {"Retry-After": retry_after} if retry_after else {}
    _send_raw(handler, status, json.dumps(payload).encode(), "application/json", extra)


def _send_raw(
    handler: BaseHTTPRequestHandler,
    status: int,
    raw: bytes,
    content_type: str,
    extra: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(raw)))
    for name, value in (extra or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(raw)


def next_move(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant's next message for the support task, from the conversation alone.

    Look the order up, refund it when delivered and the amount fits, e-mail the customer, then say
    so; a refused refund is said and ends the run. Call ids are digests of the conversation so far,
    as unpredictable to the client as a real server's, and the same for the same conversation."""
    brief = next((json.loads(m["content"]) for m in messages if m.get("role") == "user"), {})
    names = {
        call["id"]: call["function"]["name"]
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    }
    results = {
        names.get(m.get("tool_call_id"), ""): str(m.get("content"))
        for m in messages
        if m.get("role") == "tool"
    }
    call_id = "call_" + hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:24]
    order = brief.get("order_id")

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        tool_call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}

    def say(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text}

    if "lookup_order" not in results:
        return call("lookup_order", {"order_id": order})
    looked = json.loads(results["lookup_order"])
    if "refund_order" not in results:
        if looked.get("order_status") != "delivered":
            return say(f"Order {order} cannot be refunded: it goes to a person.")
        return call(
            "refund_order", {"order_id": order, "amount": brief["amount"], "currency": brief["currency"]}
        )
    refunded = json.loads(results["refund_order"])
    if not refunded.get("ok"):
        return say(f"The refund of order {order} was not paid.")
    if "email_customer" not in results:
        return call("email_customer", {"order_id": order, "template": "refund_paid"})
    return say(
        f"Refunded {brief['amount']} {brief['currency']} for order {order} (payment {refunded['reference']})."
    )


# --- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture
def chat() -> Iterator[ChatServer]:
    server = ChatServer()
    server.thread.start()
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


@pytest.fixture(autouse=True)
def on_the_server(live_server, settings, chat):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.MODEL_BACKEND = "openai"
    settings.MODEL_URL = chat.url
    settings.MODEL_NAME = "x"
    settings.MODEL_API_KEY = API_KEY
    settings.MODEL_TIMEOUT = 10
    settings.MODEL_PRICES = {MODEL_ID: (PRICE_IN, PRICE_OUT)}
    put_order("A-1", total="500.00")


def support_task(tenant, amount: str = "30.00", task_type: str = "support_agent") -> Task:
    return make_task(
        tenant,
        task_type=task_type,
        objective="Customer asks for a refund of A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": amount, "currency": "USD"},
    )


def run_until_still(task: Task, limit: int = 40) -> Task:
    for _ in range(limit):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError("the agent did not settle")


def after_backoff(task: Task) -> Task:
    """The sweep ends the retry wait (at its deadline) and the task is revalidated and run on."""
    assert task.state == State.WAITING_RETRY and task.wait_deadline is not None
    sweep.sweep(lambda task_id, region: None, now=task.wait_deadline + timedelta(seconds=1))
    return run_until_still(Task.objects.get(pk=task.pk))


def waited(task: Task) -> float:
    """Seconds from the transition into the retry wait to the wait's end."""
    event = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert event.to_state == State.WAITING_RETRY
    return (task.wait_deadline - event.created_at).total_seconds()


def codes(task: Task) -> list[str]:
    return list(
        TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("reason_code", flat=True)
    )


# --- the run -----------------------------------------------------------------------------------------------


def test_the_agent_on_a_chat_completions_server_completes_with_each_call_a_ledger_action(acme, chat):
    task = run_until_still(support_task(acme))

    assert task.state == State.COMPLETED, task.state_reason
    assert task.outcome["answer"].startswith("Refunded 30.00 USD for order A-1 (payment ")
    actions = list(Action.objects.filter(task=task).order_by("id").values_list("step", "dispatch_state"))
    assert [(step.split("#")[0], state) for step, state in actions] == [
        ("refund_order", DispatchState.SUCCEEDED),
        ("email_customer", DispatchState.SUCCEEDED),
    ]
    assert [e.system for e in Effect.objects.order_by("id")] == ["payments", "email"]
    # One request per turn (a turn recorded is replayed, never asked again), each with the key.
    assert len(chat.requests) == 4
    assert {seen["path"] for seen in chat.requests} == {"/v1/chat/completions"}
    assert {seen["authorization"] for seen in chat.requests} == {f"Bearer {API_KEY}"}
    assert {seen["body"]["model"] for seen in chat.requests} == {"x"}
    turns = AgentTurn.objects.filter(task=task).order_by("turn")
    assert [t.model_id for t in turns] == [MODEL_ID] * 4


def test_the_model_is_told_each_calls_outcome_from_the_ledger_and_the_evidence(acme, chat):
    task = run_until_still(support_task(acme))

    last = chat.requests[-1]["body"]["messages"]
    told = {m["tool_call_id"]: json.loads(m["content"]) for m in last if m["role"] == "tool"}
    refund = Action.objects.get(task=task, step__startswith="refund_order#")
    assert {"ok": True, "reference": refund.external_ref} in told.values()
    shown = {
        "order_status": "delivered",
        "order_total": "500.00",
        "order_currency": "USD",
        "refund_card": "[sealed]",
    }
    assert shown in told.values()


def test_usage_and_cost_are_recorded_per_turn_as_the_server_counted_them(acme, chat):
    task = run_until_still(support_task(acme))

    rows = list(ModelUsage.objects.filter(task=task).order_by("id"))
    counted = [seen["usage"] for seen in chat.answered()]
    assert [(r.model_id, r.input_tokens, r.output_tokens) for r in rows] == [
        (MODEL_ID, u["prompt_tokens"], u["completion_tokens"]) for u in counted
    ]
    assert [r.cost for r in rows] == [
        (u["prompt_tokens"] * PRICE_IN + u["completion_tokens"] * PRICE_OUT) / Decimal(1_000_000)
        for u in counted
    ]
    assert all(r.committed for r in rows)


def test_a_turn_the_server_did_not_count_is_unpriced_not_free(acme, chat):
    chat.faults.append("no-usage")  # the first turn's answer has no usage
    task = run_until_still(support_task(acme))

    assert task.state == State.COMPLETED, task.state_reason
    assert AgentTurn.objects.filter(task=task).count() == 4
    rows = ModelUsage.objects.filter(task=task)
    assert rows.count() == 3 and not rows.filter(cost=0).exists()


# --- failures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["500", "429", "garbled"])
def test_a_failed_model_call_waits_with_the_types_backoff_and_is_asked_once(acme, chat, fault):
    chat.faults.append(fault)
    task = run_until_still(support_task(acme))

    kind = registry.get("support_agent")
    assert (task.state, task.state_reason, task.attempt) == (State.WAITING_RETRY, "model_unavailable", 1)
    assert waited(task) == pytest.approx(kind.backoff_for(1).total_seconds(), abs=1)
    assert len(chat.requests) == 1  # neither the OpenAI client nor the SDK retried on its own
    assert (
        not AgentTurn.objects.filter(task=task).exists() and not ModelUsage.objects.filter(task=task).exists()
    )

    task = after_backoff(task)
    assert task.state == State.COMPLETED, task.state_reason
    assert task.attempt == 0 and len(chat.requests) == 5


def test_the_reason_a_model_call_failed_never_holds_the_api_key(acme, chat):
    chat.faults.append("500")
    task = run_until_still(support_task(acme))

    event = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert event.reason_code == "model_unavailable"
    assert "500" in event.reason and "upstream failed" in event.reason
    assert API_KEY not in event.reason and API_KEY[8:] not in event.reason
    assert API_KEY not in task.state_reason
    assert not TransitionEvent.objects.filter(task=task, reason__contains=API_KEY[8:]).exists()


def test_failed_calls_back_off_longer_each_time_and_fail_the_task_when_attempts_run_out(acme, chat):
    kind = registry.get("support_agent")
    chat.faults.extend(["500"] * kind.max_attempts)
    task = run_until_still(support_task(acme))
    waits = []
    while task.state == State.WAITING_RETRY:
        waits.append(waited(task))
        task = after_backoff(task)

    expected = [kind.backoff_for(n).total_seconds() for n in range(1, kind.max_attempts)]
    assert waits == pytest.approx(expected, abs=1)
    assert expected == sorted(expected) and expected[-1] > expected[0]
    assert (task.state, task.state_reason, task.attempt) == (
        State.FAILED,
        "retries_exhausted",
        kind.max_attempts,
    )
    assert task.outcome == {"reason": "retries_exhausted", "last_error": "model_unavailable"}
    assert len(chat.requests) == kind.max_attempts
    assert not Effect.objects.exists()


def variant(monkeypatch, name: str, **run_changes: Any) -> registry.TaskType:
    """``support_agent`` under another name, its agent step changed by ``run_changes``."""
    kind = registry.get("support_agent")
    agent = kind.step_as("agent", registry.AgentRun)
    changed = dataclasses.replace(
        kind,
        name=name,
        steps=tuple(
            dataclasses.replace(agent, **run_changes) if step is agent else step for step in kind.steps
        ),
    )
    monkeypatch.setitem(registry._REGISTRY, name, changed)
    return changed


@pytest.fixture
def timed_support(monkeypatch):
    """``support_agent`` whose model turns may take at most half a second (``AgentRun.timeout``)."""
    return variant(monkeypatch, "support_agent_timed", timeout=timedelta(seconds=0.5))


def test_an_agent_asking_the_sdk_to_retry_its_model_calls_is_still_asked_once_per_attempt(
    acme, chat, monkeypatch
):
    """The agent's own settings ask the SDK's runner to retry 500s three times: the run's settings
    win, and the retry is the task's (a transition with backoff), not a hidden second request."""
    agent = registry.get("support_agent").step_as("agent", registry.AgentRun).sdk_agent()
    eager = agent.clone(
        model_settings=ModelSettings(
            retry=ModelRetrySettings(
                max_retries=3,
                backoff={"initial_delay": 0, "max_delay": 0},
                policy=retry_policies.http_status([429, 500]),
            )
        )
    )
    kind = variant(monkeypatch, "support_agent_eager", agent=eager)
    chat.faults.extend(["500", "500"])
    task = run_until_still(support_task(acme, task_type=kind.name))

    assert (task.state, task.state_reason, task.attempt) == (State.WAITING_RETRY, "model_unavailable", 1)
    assert len(chat.requests) == 1


def test_an_answer_slower_than_the_steps_timeout_is_a_step_timeout_retried_later(acme, chat, timed_support):
    chat.faults.append(("slow", 3))
    started = time.monotonic()
    task = run_until_still(support_task(acme, task_type=timed_support.name))

    assert time.monotonic() - started < 3  # abandoned at the step's limit, not waited out
    assert (task.state, task.state_reason, task.attempt) == (State.WAITING_RETRY, "step_timeout", 1)
    event = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert event.trigger == "step_timed_out"
    assert waited(task) == pytest.approx(timed_support.backoff_for(1).total_seconds(), abs=1)
    assert not AgentTurn.objects.filter(task=task).exists()

    task = after_backoff(task)
    assert task.state == State.COMPLETED, task.state_reason


def test_an_answer_slower_than_the_clients_timeout_is_a_step_timeout_too(acme, chat, settings):
    settings.MODEL_TIMEOUT = 0.5
    chat.faults.append(("slow", 3))
    task = run_until_still(support_task(acme))

    assert (task.state, task.state_reason, task.attempt) == (State.WAITING_RETRY, "step_timeout", 1)
    assert len(chat.requests) == 1


def test_a_model_turn_cancel_cuts_the_request_in_flight_and_the_turn_is_asked_again_later(
    acme, chat, operator
):
    chat.faults.append(("slow", 5))
    task = support_task(acme)
    beats = Heartbeats(timedelta(seconds=0.6))  # beats (and reads cancel requests) every 0.2 s
    beats.start()
    done: list[object] = []

    def work() -> None:
        try:
            done.append(runner.run_task(task.id, worker_id="w", region="default", heartbeats=beats))
        finally:
            connections.close_all()

    worker = threading.Thread(target=work)
    started = time.monotonic()
    try:
        worker.start()
        while not chat.requests:  # the first turn's request is at the server
            assert worker.is_alive() and time.monotonic() - started < 5, done
            time.sleep(0.05)
        now_at = Task.objects.get(pk=task.pk)  # past the step that read the customer's memory
        controls.task_control(
            now_at,
            "cancel",
            user=operator,
            roles=frozenset({"operator"}),
            expected_version=now_at.state_version,
            reason="the customer called back",
            scope="model_turn",
        )
        worker.join(timeout=10)
    finally:
        beats.stop()

    assert time.monotonic() - started < 4  # the 5 s answer was not waited for
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.attempt) == (State.WAITING_RETRY, 0)  # a cancel is not a failed attempt
    event = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert event.reason_code == "cancel:model_turn"
    assert not AgentTurn.objects.filter(task=task).exists()

    task = after_backoff(task)
    assert task.state == State.COMPLETED, task.state_reason
