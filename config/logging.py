"""Structured logs: one formatter for every line the process writes, the project's and the libraries'.

``LOGGING`` (``config/settings.py``) builds its handler's formatter with ``formatter``,
which configures structlog once and returns a ``structlog.stdlib.ProcessorFormatter``.
The project logs with the standard ``logging`` module; a line's fields come from:

- ``extra={...}`` of the call (what this line is about: an action key, an error);
- the context bound with ``structlog.contextvars`` where a piece of work starts: a
  worker binds ``task_id``, ``worker_id``, ``state_version`` and ``tenant`` around
  each step of a task (``runtime.runner``), a request binds ``task_id``
  (``LogContextMiddleware``); contextvars are per thread, so a worker's slots
  never see each other's;
- the active span: ``trace_id`` and ``span_id``, read at the moment the line is
  written, so a line always names the trace it belongs to.

``LOG_FORMAT=json`` writes one JSON object per line; anything else writes
``key=value`` lines for people (structlog's console renderer, colours only on a
terminal). Either way every line is redacted (``audit.redaction``): the handler's
``RedactingFilter`` redacts the record, and ``redact_fields`` below every field
again after the traceback was rendered into text — so a value no filter saw
(an object's ``repr``, a traceback rendered here) is redacted too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from django.http import HttpRequest, HttpResponse
from opentelemetry import trace
from structlog.typing import EventDict, Processor, WrappedLogger

from audit.redaction import redact_value

# Values written as they are; anything else (a request, a UUID, a datetime) as its text, redacted.
_PLAIN = (str, int, float, bool, type(None), Mapping, list, tuple)
# Keys structlog uses for its own bookkeeping on the way to the renderer.
_INTERNAL = frozenset({"_record", "_from_structlog", "exc_info"})
# Set by another formatter that saw the record first; not the caller's fields.
_FORMATTED = frozenset({"message", "asctime"})

_configured = False


def add_trace_context(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
    """The active span's trace and span ids (W3C hex), when there is a span."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
    return event


def drop_formatted(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
    for key in _FORMATTED & event.keys():
        del event[key]
    return event


def redact_fields(logger: WrappedLogger, name: str, event: EventDict) -> EventDict:
    """Every field redacted: text as ``redact`` does, values under secret or sensitive keys masked."""
    kept = {key: event[key] for key in _INTERNAL & event.keys()}
    fields = {
        key: value if isinstance(value, _PLAIN) else str(value)
        for key, value in event.items()
        if key not in _INTERNAL
    }
    return {**redact_value(fields), **kept}


def configure() -> None:
    """Configure structlog once per process: a structlog logger writes through ``logging``.

    Its call becomes an ordinary ``logging`` call (the event as the message, its fields as
    ``extra=``), so the handler's ``RedactingFilter`` and this module's formatter treat it
    like any other line (the filter rewrites a message it redacts, which a record carrying
    structlog's own event dict would not survive).
    """
    global _configured
    if _configured:
        return
    _configured = True
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, structlog.stdlib.render_to_log_kwargs],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


def renderer(log_format: str) -> Processor:
    """One JSON object per line for ``json``; otherwise aligned ``key=value`` text for people."""
    if log_format == "json":
        return structlog.processors.JSONRenderer()
    # The handler writes to stderr: colours there only when a person watches it.
    return structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())


def formatter(log_format: str = "console") -> structlog.stdlib.ProcessorFormatter:
    """The formatter ``LOGGING`` installs (``"()": "config.logging.formatter"``)."""
    configure()
    return structlog.stdlib.ProcessorFormatter(
        # The call's ``extra=`` fields are added over the bound context: the call knows best.
        foreign_pre_chain=[
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.ExtraAdder(),
            drop_formatted,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            add_trace_context,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            # The traceback as plain text (never with local variables), then redacted with the rest.
            structlog.processors.format_exc_info,
            redact_fields,
            renderer(log_format),
        ],
    )


class LogContextMiddleware:
    """Binds the task a request is about (its URL's ``task_id``) to every line the request logs.

    First in ``MIDDLEWARE``: the context is cleared as a request begins and ends, so a
    thread serving the next request starts from nothing.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        structlog.contextvars.clear_contextvars()
        try:
            return self.get_response(request)
        finally:
            structlog.contextvars.clear_contextvars()

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: dict[str, Any]
    ) -> None:
        if "task_id" in kwargs:
            structlog.contextvars.bind_contextvars(task_id=str(kwargs["task_id"]))
