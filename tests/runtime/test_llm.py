"""The model adapters: the OpenAI-compatible client against a local fake endpoint, and the scripted model.

The fake endpoint is a real HTTP server on 127.0.0.1 (port 0), so the adapter's
own httpx client, timeouts and error mapping are exercised — no transport mock.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runtime import llm
from runtime.llm import ModelUnavailable, OpenAICompatibleModel, Reply, ScriptedModel


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def completion(text: str, model: str = "served-model") -> dict[str, Any]:
    """A chat-completions reply body as an OpenAI-compatible server sends it."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


@dataclass
class FakeEndpoint:
    """What the fake server answers next, and every request it received."""

    url: str = ""
    status: int = 200
    body: bytes = field(default_factory=lambda: json.dumps(completion("refund")).encode())
    delay: float = 0.0
    received: list[Received] = field(default_factory=list)
    # Set at teardown so a handler still sleeping through ``delay`` ends at once.
    closing: threading.Event = field(default_factory=threading.Event)

    def reply(
        self, *, status: int = 200, payload: Any = None, raw: bytes | None = None, delay: float = 0.0
    ) -> None:
        self.status, self.delay = status, delay
        self.body = raw if raw is not None else json.dumps(payload).encode()

    def model(self, **kwargs: Any) -> OpenAICompatibleModel:
        kwargs.setdefault("model", "gpt-test")
        kwargs.setdefault("timeout", 5.0)
        return OpenAICompatibleModel(base_url=f"{self.url}/v1", **kwargs)


def _handler_for(endpoint: FakeEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            endpoint.received.append(
                Received(
                    method="POST",
                    path=self.path,
                    headers={name.lower(): value for name, value in self.headers.items()},
                    body=self.rfile.read(length),
                )
            )
            if endpoint.delay and endpoint.closing.wait(endpoint.delay):
                return
            try:
                self.send_response(endpoint.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(endpoint.body)))
                self.end_headers()
                self.wfile.write(endpoint.body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing left to answer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base class signature)
            pass  # keep pytest's output clean

    return Handler


@pytest.fixture
def endpoint(monkeypatch) -> Iterator[FakeEndpoint]:
    # httpx honours proxy variables; the loopback server must be reached directly.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeEndpoint()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll interval so shutdown() at teardown returns at once.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield fake
    fake.closing.set()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


FACTS = {"order_id": "A-1", "order_status": "delivered", "amount": Decimal("10.00"), "order_total": 25}


def ask(model: OpenAICompatibleModel) -> Reply:
    return model.complete(prompt_id="refund-triage@1", system="You triage refunds.", facts=FACTS)


# Request shape


def test_completion_is_posted_to_chat_completions_under_the_base_url(endpoint):
    model = OpenAICompatibleModel(base_url=f"{endpoint.url}/v1/", model="gpt-test")  # trailing slash dropped
    ask(model)
    [request] = endpoint.received
    assert (request.method, request.path) == ("POST", "/v1/chat/completions")
    assert request.headers["content-type"] == "application/json"


def test_request_names_the_configured_model_at_temperature_zero(endpoint):
    ask(endpoint.model(model="gpt-test"))
    body = endpoint.received[0].json()
    assert body["model"] == "gpt-test"
    assert body["temperature"] == 0


def test_request_sends_the_system_prompt_then_the_facts_as_json(endpoint):
    ask(endpoint.model())
    system, user = endpoint.received[0].json()["messages"]
    assert system == {"role": "system", "content": "You triage refunds."}
    assert user["role"] == "user"
    # Values JSON cannot hold (a Decimal amount) travel as their string form.
    assert json.loads(user["content"]) == {
        "order_id": "A-1",
        "order_status": "delivered",
        "amount": "10.00",
        "order_total": 25,
    }


def test_facts_are_sent_with_sorted_keys_so_the_same_facts_make_the_same_request(endpoint):
    model = endpoint.model()
    model.complete(prompt_id="p@1", system="s", facts={"b": 1, "a": 2})
    model.complete(prompt_id="p@1", system="s", facts={"a": 2, "b": 1})
    first, second = (request.json()["messages"][1]["content"] for request in endpoint.received)
    assert first == second == '{"a": 2, "b": 1}'


def test_api_key_is_sent_as_a_bearer_token(endpoint):
    ask(endpoint.model(api_key="sk-test-123"))
    assert endpoint.received[0].headers["authorization"] == "Bearer sk-test-123"


def test_no_authorization_header_is_sent_without_an_api_key(endpoint):
    ask(endpoint.model())
    assert "authorization" not in endpoint.received[0].headers


# Reply parsing


def test_reply_text_is_stripped_of_surrounding_whitespace(endpoint):
    endpoint.reply(payload=completion("  \n refund \n"))
    assert ask(endpoint.model()).text == "refund"


def test_reply_records_the_model_the_server_says_answered(endpoint):
    endpoint.reply(payload=completion("refund", model="gpt-test-2025-01-01"))
    reply = ask(endpoint.model(model="gpt-test"))
    assert reply == Reply("refund", "openai-compatible:gpt-test-2025-01-01")


def test_reply_without_a_model_name_records_the_requested_model(endpoint):
    payload = completion("refund")
    del payload["model"]
    endpoint.reply(payload=payload)
    assert ask(endpoint.model(model="gpt-test")).model_id == "openai-compatible:gpt-test"


# Failures: each is transient (ModelUnavailable), never a crash of the worker


def test_a_server_slower_than_the_timeout_raises_model_unavailable_promptly(endpoint):
    endpoint.reply(payload=completion("too late"), delay=10.0)
    model = endpoint.model(timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ModelUnavailable, match="timed out"):
        ask(model)
    assert time.monotonic() - started < 2.0  # the timeout, not the server's 10 s sleep


def test_http_500_raises_model_unavailable(endpoint):
    endpoint.reply(status=500, payload={"error": {"message": "overloaded"}})
    with pytest.raises(ModelUnavailable, match="500"):
        ask(endpoint.model())
    assert len(endpoint.received) == 1  # the adapter does not retry; the workflow's wait does


def test_garbled_json_raises_model_unavailable(endpoint):
    endpoint.reply(raw=b'{"choices": [{"message": ')
    with pytest.raises(ModelUnavailable):
        ask(endpoint.model())


def test_a_reply_without_choices_raises_model_unavailable(endpoint):
    endpoint.reply(payload={"id": "chatcmpl-1", "model": "gpt-test"})
    with pytest.raises(ModelUnavailable):
        ask(endpoint.model())


@pytest.mark.parametrize(
    "payload",
    [
        {"choices": []},
        {"choices": [{"message": {}}]},
        {"choices": [{"message": {"role": "assistant", "content": None}}]},
        {"choices": [{"message": {"role": "assistant", "content": ["refund"]}}]},
        ["not", "an", "object"],
    ],
    ids=["empty-choices", "no-content", "null-content", "non-text-content", "top-level-list"],
)
def test_a_reply_without_text_content_raises_model_unavailable(endpoint, payload):
    endpoint.reply(payload=payload)
    with pytest.raises(ModelUnavailable):
        ask(endpoint.model())


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then closed again)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_endpoint_raises_model_unavailable():
    url = f"http://127.0.0.1:{unused_port()}/v1"
    model = OpenAICompatibleModel(base_url=url, model="gpt-test", timeout=2.0)
    with pytest.raises(ModelUnavailable):
        ask(model)


# The scripted model


TRIAGE = "refund-triage@1"


def triage(**facts: Any) -> Reply:
    return ScriptedModel().complete(prompt_id=TRIAGE, system="", facts=facts)


def test_scripted_triage_refunds_a_delivered_order_within_its_total():
    reply = triage(order_status="delivered", amount="10.00", order_total="25.00")
    assert reply == Reply("refund", "scripted-v1")


def test_scripted_triage_refunds_an_amount_equal_to_the_order_total():
    assert triage(order_status="delivered", amount="25.00", order_total="25.00").text == "refund"


def test_scripted_triage_escalates_an_amount_above_the_order_total():
    assert triage(order_status="delivered", amount="25.01", order_total="25.00").text == "escalate"


def test_scripted_triage_escalates_an_order_not_yet_delivered():
    assert triage(order_status="shipped", amount="1.00", order_total="25.00").text == "escalate"


def test_scripted_triage_escalates_when_the_order_facts_are_missing():
    assert triage(amount="1.00").text == "escalate"


def test_scripted_model_gives_the_same_answer_every_time():
    facts = {"order_status": "delivered", "amount": 5, "order_total": 9}
    answers = {ScriptedModel().complete(prompt_id=TRIAGE, system="", facts=facts) for _ in range(5)}
    assert answers == {Reply("refund", "scripted-v1")}


def test_scripted_model_without_a_script_for_the_prompt_raises_model_unavailable():
    with pytest.raises(ModelUnavailable, match="no-such-prompt@1"):
        ScriptedModel().complete(prompt_id="no-such-prompt@1", system="", facts={})


def test_scripted_model_answers_only_from_the_scripts_it_was_given():
    model = ScriptedModel({"echo@1": lambda facts: str(facts["x"])})
    assert model.complete(prompt_id="echo@1", system="", facts={"x": 7}).text == "7"
    with pytest.raises(ModelUnavailable):
        model.complete(prompt_id=TRIAGE, system="", facts={})


def test_the_process_model_follows_a_change_of_its_settings(settings):
    """The process's model is cached; a changed ``MODEL_*`` setting (a test's, ``override_settings``)
    must not leave the old one in place: a suite that pointed it at a stopped server once left every
    later task of that process failing its model turns (``model_unavailable``)."""
    settings.MODEL_BACKEND = "openai"
    settings.MODEL_URL = "http://127.0.0.1:9/v1"
    settings.MODEL_NAME = "x"
    assert isinstance(llm.default_model(), OpenAICompatibleModel)

    settings.MODEL_BACKEND = "scripted"
    assert isinstance(llm.default_model(), ScriptedModel)
