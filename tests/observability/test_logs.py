"""Structured logs (``config/logging.py``): every line of a task's work says which task, which version,
which worker, which tenant and which trace — as JSON with ``LOG_FORMAT=json``, as ``key=value`` text
for people otherwise — and no line carries a secret.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable, Iterator

import pytest
import structlog
from django.test import RequestFactory
from structlog.stdlib import ProcessorFormatter

from audit.models import TransitionEvent
from audit.redaction import MASK, RedactingFilter
from config.logging import LogContextMiddleware, formatter
from tasks.states import State
from tests.conftest import make_task
from tests.observability.test_traces import REFUND, install_tracing, run
from tests.workflow import put_order

TOKEN = "tok_live_7a4c2e9b1d"
PASSWORD = "hunter2-but-longer"


def capture(log_format: str) -> Callable[[], Iterator[io.StringIO]]:
    """A fixture: what the root logger writes at INFO through LOGGING's filter and this formatter."""

    def fixture() -> Iterator[io.StringIO]:
        buffer = io.StringIO()
        handler = logging.StreamHandler(buffer)
        handler.addFilter(RedactingFilter())
        handler.setFormatter(formatter(log_format))
        root = logging.getLogger()
        level = root.level
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        structlog.contextvars.clear_contextvars()
        yield buffer
        root.removeHandler(handler)
        root.setLevel(level)
        structlog.contextvars.clear_contextvars()

    return fixture


json_lines = pytest.fixture(capture("json"))
text_lines = pytest.fixture(capture("console"))


def parsed(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]


@pytest.fixture
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1")


def test_logging_renders_every_line_with_the_structured_formatter():
    handlers = [
        h for h in logging.getLogger().handlers if any(isinstance(f, RedactingFilter) for f in h.filters)
    ]
    assert handlers and all(isinstance(h.formatter, ProcessorFormatter) for h in handlers)


@pytest.mark.django_db(transaction=True)
def test_a_worker_step_logs_json_lines_naming_task_version_worker_tenant_and_trace(
    sandbox, json_lines, acme, operator, monkeypatch
):
    install_tracing(monkeypatch)
    task = run(make_task(acme, owner=operator, input=REFUND))
    assert task.state == State.WAITING_INPUT
    # The run's lines: ours, and a library's (httpx reading the order from the sandbox).
    worker = [
        line
        for line in parsed(json_lines)
        if line["logger"] in ("tasks.transitions", "httpx") and line["event"] != "task started"
    ]
    trace_id = TransitionEvent.objects.get(task=task, state_version=1).trace_id
    for line in worker:
        assert line["task_id"] == str(task.id) and line["worker_id"] == "test-worker"
        assert line["tenant"] == acme.pk
        assert line["trace_id"] == trace_id  # the run continues the trace that created the task
        assert line["level"] == "info" and "timestamp" in line
    # The version the step started from; each transition's line, the version it wrote.
    assert [(line["logger"], line["state_version"]) for line in worker] == [
        ("httpx", 1),
        ("tasks.transitions", 2),
        ("tasks.transitions", 3),
        ("tasks.transitions", 4),
    ]
    # Nothing of the run is left bound to the thread once it is over.
    assert structlog.contextvars.get_contextvars() == {}


def test_a_line_logged_inside_a_step_carries_the_bound_context(json_lines):
    structlog.contextvars.bind_contextvars(task_id="t-1", worker_id="w-1", state_version=7, tenant=3)
    logging.getLogger("runtime.dispatch").warning("outcome unknown", extra={"action": "t-1:pay:abc"})
    [line] = parsed(json_lines)
    assert line == {
        "event": "outcome unknown",
        "task_id": "t-1",
        "worker_id": "w-1",
        "state_version": 7,
        "tenant": 3,
        "action": "t-1:pay:abc",
        "level": "warning",
        "logger": "runtime.dispatch",
        "timestamp": line["timestamp"],
    }


def test_a_secret_in_a_message_its_arguments_extras_or_traceback_is_redacted(json_lines, settings):
    log = logging.getLogger("runtime.tests")
    try:
        raise RuntimeError(f"login failed with password={PASSWORD}")
    except RuntimeError:
        log.exception(
            "calling %s with Bearer %s", "https://svc:pw@api.example/x", TOKEN, extra={"api_key": TOKEN}
        )
    log.warning("the sandbox said no to %s", settings.SANDBOX_TOKEN)
    structlog.get_logger("runtime.tests").warning("structlog too", password=PASSWORD, note=f"token={TOKEN}")
    text = json_lines.getvalue()
    for secret in (TOKEN, PASSWORD, "svc:pw", settings.SANDBOX_TOKEN):
        assert secret not in text
    failed, refused, native = parsed(json_lines)
    assert failed["event"] == f"calling https://{MASK}@api.example/x with Bearer {MASK}"
    assert failed["api_key"] == MASK
    assert failed["exception"].startswith("Traceback") and f"password={MASK}" in failed["exception"]
    assert refused["event"] == f"the sandbox said no to {MASK}"
    assert (native["event"], native["password"], native["note"]) == ("structlog too", MASK, f"token={MASK}")


def test_the_human_format_writes_key_value_lines_without_colour(text_lines):
    structlog.contextvars.bind_contextvars(task_id="t-9", worker_id="w-2")
    logging.getLogger("tasks.transitions").info(
        "task advanced", extra={"state_version": 4, "to_state": "ready"}
    )
    [line] = text_lines.getvalue().splitlines()
    assert "task advanced" in line and "[tasks.transitions]" in line and "info" in line
    for pair in ("task_id=t-9", "worker_id=w-2", "state_version=4", "to_state=ready"):
        assert pair in line
    assert "\x1b[" not in line  # not a terminal: no colour codes
    assert not line.lstrip().startswith("{")


def test_a_request_about_a_task_names_it_on_every_line_and_forgets_it_after(json_lines, settings):
    # Around everything of ours (OpenTelemetry's instrumentation may have put its own in front).
    ours = [name for name in settings.MIDDLEWARE if not name.startswith("opentelemetry.")]
    assert ours[0] == "config.logging.LogContextMiddleware"
    log = logging.getLogger("api.tests")
    middleware: LogContextMiddleware

    def view(request):
        middleware.process_view(request, view, (), {"task_id": "0190-abc"})
        log.warning("inside the view")
        return "response"

    middleware = LogContextMiddleware(view)
    assert middleware(RequestFactory().get("/api/tasks/0190-abc/")) == "response"
    log.warning("after the request")
    inside, after = parsed(json_lines)
    assert inside["task_id"] == "0190-abc" and "task_id" not in after
