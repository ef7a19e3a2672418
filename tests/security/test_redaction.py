"""Secrets never reach what is kept or shown (issue 12, item 2).

``audit.redaction.redact`` on its own, then at each exit: the append-only
audit reason, the ledger's last error, log lines and exported spans, each fed
a failure whose message carries a token and a URL credential.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from audit.models import TransitionEvent
from audit.redaction import MASK, RedactingFilter, redact, redact_value, register_sensitive_fields
from config.otel import RedactingExporter
from ledger.connectors.base import Rejected
from ledger.connectors.http import HTTPConnector
from ledger.models import Action, DispatchState
from runtime import runner
from runtime.llm import ModelUnavailable, Reply
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import invoice_task
from tests.standin import RecordServer, record_server

TOKEN = "tok-9f8e7d6c5b4a"
PASSWORD = "hunter2-s3cret"
MODEL_KEY = "sk-live-0123456789abcdef"
# A failure message as a client library writes it: the URL it called (with its credential) and the
# header it sent.
LEAKY = (
    f"could not reach https://svc:{PASSWORD}@api.example/v1 (Authorization: Bearer {TOKEN}, key {MODEL_KEY})"
)


def assert_clean(text: str) -> None:
    for secret in (TOKEN, PASSWORD, MODEL_KEY):
        assert secret not in text


@pytest.fixture(autouse=True)
def secrets(settings):
    settings.MODEL_API_KEY = MODEL_KEY


# --- the function ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("https://svc:pw@api.example/x", "https://***@api.example/x"),
        ("postgres://app:p@ss@db:5432/main", "postgres://***@db:5432/main"),
        ("redis://:pw@cache:6379/0 and ftp://anon@files", "redis://***@cache:6379/0 and ftp://***@files"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: ***"),
        ("sent Bearer abc.def-ghi to it", "sent Bearer *** to it"),
        ("header Token 0123456789abcdef", "header Token ***"),
        ("GET /x?api_key=abc&access_token=zzz&page=2", "GET /x?api_key=***&access_token=***&page=2"),
        ('{"password": "pw", "user": "bob"}', '{"password": "***", "user": "bob"}'),
        ("{'client_secret': 'cs', 'X-Api-Key': 'k'}", "{'client_secret': '***', 'X-Api-Key': '***'}"),
        (
            "passwd=pw apikey=k access_key=a cookie=c sessionid=s",
            "passwd=*** apikey=*** access_key=*** cookie=*** sessionid=***",
        ),
        ("Cookie: sessionid=abc; csrftoken=def", "Cookie: ***; csrftoken=***"),
        ("note=password=pw", "note=password=***"),
    ],
)
def test_redact_removes_url_credentials_tokens_and_secret_pairs(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "task is at version 3, not 2",
        "orders answered 503",
        "lease #12 on task 4f1e is no longer held: the task was taken over",
        "token bucket exhausted; see https://status.example/incidents?id=7",
        "checkpoint digest mismatch: Digest of body differs",
    ],
)
def test_redact_leaves_ordinary_reasons_alone(text):
    assert redact(text) == text


# Issue 20 (item 6): URL credentials written with one slash, JSON-escaped or percent-encoded; secrets
# in query strings under names that do not say "token"; card numbers and e-mail addresses in what a
# connector's system answered.
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("GET https:/svc:pw@api.example/x failed", "GET https:/***@api.example/x failed"),
        ('{"url": "https:\\/\\/svc:pw@api.example\\/x"}', '{"url": "https:\\/\\/***@api.example\\/x"}'),
        ("next=https%3A%2F%2Fsvc%3Apw%40api.example%2Fx", "next=https%3A%2F%2F***%40api.example%2Fx"),
        (
            "GET /f?X-Amz-Credential=AKIA1/s3&X-Amz-Signature=9f8e&Expires=60",
            "GET /f?X-Amz-Credential=***&X-Amz-Signature=***&Expires=60",
        ),
        (
            "https://h/dl?signature=abc123&sig=def&key=AIzaSy0&page=2",
            "https://h/dl?signature=***&sig=***&key=***&page=2",
        ),
        ("callback?auth=s3cr3t&jwt=eyJ.x.y;pwd=pw", "callback?auth=***&jwt=***;pwd=***"),
        ("private_key: -----BEGIN", "private_key: ***"),
        ("card 4111 1111 1111 1111 was declined", "card ***1111 was declined"),
        ("pan=4111-1111-1111-1111", "pan=***1111"),
        ("refused 5555555555554444 and 378282246310005", "refused ***4444 and ***0005"),
        ("no account for bob.smith+refunds@mail.example.com", "no account for ***@mail.example.com"),
    ],
)
def test_redact_removes_url_forms_query_secrets_cards_and_email_addresses(text, expected):
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "order 4111111111111112 not found",  # 16 digits that fail the card checksum
        "at 1764597600000 ms, 20261201140348 too",  # timestamps
        "the key order_id is missing (key: order_id)",  # a dictionary key named in prose
        "refund ref=A-1&page=2",
    ],
)
def test_redact_leaves_numbers_that_are_no_card_and_keys_in_prose_alone(text):
    assert redact(text) == text


def test_a_connector_refusal_quoting_a_card_and_an_address_keeps_neither(monkeypatch, settings):
    settings.CONNECTOR_URLS = {"payments": "https://pay.example"}

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, text="card 4242 4242 4242 4242 of jane@customer.example declined")

    client = httpx.Client(transport=httpx.MockTransport(handle))
    monkeypatch.setattr("config.http.client", lambda: client)
    with pytest.raises(Rejected) as refused:
        HTTPConnector("payments").dispatch("k-1", {})
    assert str(refused.value).endswith("(422): card ***4242 of ***@customer.example declined")


def test_redact_removes_every_configured_secret_wherever_it_appears(settings):
    settings.CONNECTOR_TOKENS = {"payments": TOKEN}
    settings.FIELD_ENCRYPTION_KEYS = f"k1:{PASSWORD}"
    text = f"payments said {TOKEN}; key {MODEL_KEY!r}; encrypted with {PASSWORD}"
    assert redact(text) == "payments said ***; key '***'; encrypted with ***"


def test_a_changed_secret_is_redacted_at_once(settings):
    assert redact(f"x {MODEL_KEY}") == f"x {MASK}"
    settings.MODEL_API_KEY = "sk-rotated-abcdefgh"
    assert redact("x sk-rotated-abcdefgh") == f"x {MASK}"


def test_a_short_configured_value_is_not_searched_for_in_free_text(settings):
    settings.MODEL_API_KEY = "abc"
    assert redact("abcdef is a word") == "abcdef is a word"


def test_fields_marked_sensitive_are_masked_in_text_and_in_structures():
    register_sensitive_fields(["redaction_test_card"])
    assert redact('facts {"redaction_test_card": "visa-1881"}') == 'facts {"redaction_test_card": "***"}'
    assert redact("redaction_test_card=visa-1881") == "redaction_test_card=***"
    value = {
        "redaction_test_card": "visa-1881",
        "email": "c@example.com",
        "nested": [{"api_key": "k-1", "url": "https://u:pw@h/x", "n": 3}],
        "empty_password": "",
    }
    assert redact_value(value, sensitive={"email"}) == {
        "redaction_test_card": MASK,
        "email": MASK,
        "nested": [{"api_key": MASK, "url": "https://***@h/x", "n": 3}],
        "empty_password": "",
    }


# --- the audit log -----------------------------------------------------------------------------


@pytest.fixture
def orders(settings) -> Iterator[RecordServer]:
    with record_server() as records:
        settings.CONNECTOR_URLS = {**settings.CONNECTOR_URLS, "orders": records.url}
        records.put("O-1", {"status": "delivered"})
        yield records


class FailingModel:
    """A model whose call fails with ``error``."""

    model_id = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
        raise self.error


def run_lookup(tenant, model: FailingModel) -> Task:
    task = make_task(tenant, task_type="order_lookup", objective="Look up O-1", input={"order_id": "O-1"})
    runner.run_task(task.id, worker_id="w", region="default", model=model)
    return Task.objects.get(pk=task.pk)


def last_reason(task: Task) -> str:
    return TransitionEvent.objects.filter(task=task).latest("state_version").reason


@pytest.mark.django_db(transaction=True)
def test_a_model_failure_quoting_credentials_leaves_none_in_the_audit_reason(acme, orders):
    task = run_lookup(acme, FailingModel(ModelUnavailable(f"model call failed: {LEAKY}")))
    assert (task.state, task.state_reason) == (State.WAITING_RETRY, "model_unavailable")
    reason = last_reason(task)
    assert_clean(reason)
    assert reason.startswith("model call failed: could not reach https://***@api.example/v1")


@pytest.mark.django_db(transaction=True)
def test_a_step_error_quoting_credentials_is_quarantined_with_a_clean_reason_and_log(
    acme, orders, log_output
):
    task = run_lookup(acme, FailingModel(RuntimeError(LEAKY)))
    assert (task.state, task.state_reason) == (State.QUARANTINED, "step_error")
    assert last_reason(task).startswith("RuntimeError: could not reach https://***@")
    assert_clean(last_reason(task))
    logged = log_output.getvalue()
    assert "step failed; quarantining" in logged and "RuntimeError" in logged  # the traceback is kept
    assert_clean(logged)


# --- the ledger --------------------------------------------------------------------------------


def failing_transport(monkeypatch) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(LEAKY, request=request)

    client = httpx.Client(transport=httpx.MockTransport(handle))
    monkeypatch.setattr("config.http.client", lambda: client)


def test_a_connector_failure_message_is_redacted(monkeypatch, settings):
    settings.CONNECTOR_URLS = {"payments": "https://pay.example"}
    failing_transport(monkeypatch)
    with pytest.raises(Exception) as failed:
        HTTPConnector("payments").dispatch("k-1", {})
    assert "ConnectError: could not reach https://***@api.example/v1" in str(failed.value)
    assert_clean(str(failed.value))


@pytest.mark.django_db(transaction=True)
def test_an_unknown_outcome_quoting_credentials_leaves_none_in_the_ledger_audit_or_log(
    acme, monkeypatch, settings, log_output
):
    settings.CONNECTOR_URLS = {"payments": "https://pay.example"}
    failing_transport(monkeypatch)
    task = invoice_task(acme)
    runner.run_task(task.id, worker_id="w", region="default")
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.UNKNOWN
    assert "could not reach https://***@api.example/v1" in action.last_error
    assert_clean(action.last_error)
    for event in TransitionEvent.objects.filter(task=task):
        assert_clean(event.reason)
    assert_clean(log_output.getvalue())


# --- logs and spans ----------------------------------------------------------------------------


@pytest.fixture
def log_output() -> Iterator[io.StringIO]:
    """What the handlers LOGGING installed write, captured (the settings must install the filter)."""
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if any(isinstance(f, RedactingFilter) for f in handler.filters)
    ]
    assert handlers, "LOGGING installs no redacting handler"
    buffer = io.StringIO()
    streams = [
        (handler, handler.setStream(buffer))
        for handler in handlers
        if isinstance(handler, logging.StreamHandler)
    ]
    yield buffer
    for handler, stream in streams:
        if stream is not None:
            handler.setStream(stream)


def test_a_log_line_its_arguments_extras_and_traceback_are_redacted(log_output):
    log = logging.getLogger("tests.security")
    try:
        raise RuntimeError(LEAKY)
    except RuntimeError:
        log.exception("call to %s failed", f"https://svc:{PASSWORD}@api.example", extra={"error": LEAKY})
    record_text = log_output.getvalue()
    assert "call to https://***@api.example failed" in record_text
    assert "Traceback" in record_text and "RuntimeError: could not reach" in record_text
    assert_clean(record_text)


def test_the_filter_redacts_extras_for_structured_formatters():
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "outcome unknown", None, None)
    record.error = LEAKY
    record.detail = {"token": TOKEN}
    RedactingFilter().filter(record)
    assert_clean(record.error)
    assert record.detail == {"token": MASK}


def test_exported_spans_carry_no_secret_in_attributes_events_or_status():
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(RedactingExporter(exported)))
    tracer = provider.get_tracer("tests")
    with tracer.start_as_current_span("call") as span:
        span.set_attribute("http.url", f"https://svc:{PASSWORD}@api.example/x?access_token={TOKEN}")
        span.set_attribute("http.request.header.authorization", (f"Bearer {TOKEN}",))
        span.record_exception(RuntimeError(LEAKY))
        span.set_status(Status(StatusCode.ERROR, LEAKY))
    (finished,) = exported.get_finished_spans()
    assert finished.attributes["http.url"] == "https://***@api.example/x?access_token=***"
    assert finished.attributes["http.request.header.authorization"] == MASK
    texts = [str(dict(event.attributes or {})) for event in finished.events] + [finished.status.description]
    assert "could not reach" in texts[0]
    for text in texts:
        assert_clean(str(text))
