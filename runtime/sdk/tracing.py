"""The SDK's tracing spans, joined to our OpenTelemetry traces.

The SDK traces a run on its own (agent, generation, function, handoff, guardrail spans) and by
default sends them to OpenAI. Here its processors are replaced by one bridge: each SDK span becomes
an OpenTelemetry span, a child of the SDK span that contains it or, at the top, of whatever span is
current when the run starts (the worker's step span), so a task's trace shows what the agent did in
each step. Nothing leaves the process but through our exporters.

Only the names and shapes are copied (the span's type, its name, the agent's tools and handoffs, a
function's name, whether a guardrail tripped), never inputs or outputs: the run is told
``trace_include_sensitive_data=False``, and this bridge copies no ``input``/``output`` field
either. A step that replays the run's earlier turns from the records shows their spans again in its
trace, each as short as a read from memory. A run kept waiting between steps (``replay._Live``) keeps
its SDK spans open under the step that began it; a model turn it asks later is a span of the step
that asks it.
"""

from __future__ import annotations

import threading
from typing import Any

from agents.tracing import Span as SdkSpan
from agents.tracing import Trace, TracingProcessor, set_trace_processors
from opentelemetry import context as otel_context
from opentelemetry import trace

tracer = trace.get_tracer("runtime.sdk")

# Fields of a span's export copied as attributes (``durable.sdk.<field>``): names and shapes only.
_SHAPES = ("name", "tools", "handoffs", "output_type", "from_agent", "to_agent", "triggered", "model")


class OpenTelemetryBridge(TracingProcessor):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[str, trace.Span] = {}

    def on_trace_start(self, trace_: Trace) -> None:
        return None

    def on_trace_end(self, trace_: Trace) -> None:
        return None

    def on_span_start(self, span: SdkSpan[Any]) -> None:
        with self._lock:
            parent = self._open.get(span.parent_id or "")
        where = trace.set_span_in_context(parent) if parent is not None else otel_context.get_current()
        data = span.span_data
        exported = data.export() or {}
        label = str(exported.get("name") or "")
        otel = tracer.start_span(f"agent.{data.type}" + (f" {label}" if label else ""), context=where)
        with self._lock:
            self._open[span.span_id] = otel

    def on_span_end(self, span: SdkSpan[Any]) -> None:
        with self._lock:
            otel = self._open.pop(span.span_id, None)
        if otel is None:
            return
        exported = span.span_data.export() or {}  # complete now (an agent's tools are filled in late)
        for field in _SHAPES:
            value = exported.get(field)
            if isinstance(value, str | bool | int):
                otel.set_attribute(f"durable.sdk.{field}", value)
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                otel.set_attribute(f"durable.sdk.{field}", value)
        if span.error is not None:
            otel.set_status(trace.Status(trace.StatusCode.ERROR, str(span.error.get("message", ""))[:200]))
        otel.end()

    def shutdown(self) -> None:
        with self._lock:
            left, self._open = list(self._open.values()), {}
        for otel in left:
            otel.end()

    def force_flush(self) -> None:
        return None


BRIDGE = OpenTelemetryBridge()


def install() -> None:
    """Make the bridge the SDK's only trace processor (its exporter to OpenAI goes)."""
    set_trace_processors([BRIDGE])
