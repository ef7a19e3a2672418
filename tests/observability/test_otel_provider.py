"""The tracer provider ``config.otel.configure`` installs: ids only without an exporter, else the SDK's."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from audit.models import TransitionEvent
from config import otel
from tasks import services, transitions
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress


def test_without_an_exporter_spans_carry_ids_and_record_nothing():
    tracer = otel.tracer_provider(exporting=False).get_tracer("tests")
    with tracer.start_as_current_span("outer", attributes={"durable.task.id": "t"}) as outer:
        with tracer.start_as_current_span("inner") as inner:
            inner.set_attribute("durable.step", "s")
    assert not isinstance(outer, ReadableSpan) and not outer.is_recording()
    assert not isinstance(inner, ReadableSpan) and not inner.is_recording()
    parent, child = outer.get_span_context(), inner.get_span_context()
    assert parent.is_valid and child.is_valid
    assert child.trace_id == parent.trace_id and child.span_id != parent.span_id
    assert parent.trace_flags.sampled  # as the SDK's default sampler marks a new trace


def test_without_an_exporter_a_span_continues_its_parents_trace_and_decision():
    tracer = otel.tracer_provider(exporting=False).get_tracer("tests")
    for sampled in (True, False):
        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED if sampled else trace.TraceFlags.DEFAULT)
        origin = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=flags)
        with tracer.start_as_current_span(
            "task.run", context=trace.set_span_in_context(trace.NonRecordingSpan(origin))
        ) as span:
            context = span.get_span_context()
        assert (context.trace_id, context.trace_flags.sampled) == (0xABC, sampled)
        assert context.span_id != 0xDEF


def test_without_an_exporter_a_transition_still_records_its_trace(acme, monkeypatch):
    """The audit log's trace id and the checkpoint's traceparent come from ids-only spans too."""
    monkeypatch.setattr(transitions, "tracer", otel.tracer_provider(exporting=False).get_tracer("tests"))
    task = make_task(acme)
    advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress("traced"))
    event = TransitionEvent.objects.get(task=task, state_version=2)
    assert len(event.trace_id) == 32 and int(event.trace_id, 16) != 0
    assert services.latest_checkpoint(task).trace_link.startswith(f"00-{event.trace_id}-")
    assert services.latest_checkpoint(task).trace_link.endswith("-01")


def test_with_an_exporter_the_sdk_records_and_exports_redacted_spans(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert otel.exporting()
    provider = otel.tracer_provider(exporting=otel.exporting())
    assert isinstance(provider, TracerProvider)
    processors = provider._active_span_processor._span_processors
    assert [type(p) for p in processors] == [BatchSpanProcessor]
    assert isinstance(processors[0].span_exporter, otel.RedactingExporter)
    exported = processors[0].span_exporter.inner = InMemorySpanExporter()  # not the network
    with provider.get_tracer("tests").start_as_current_span("recorded") as span:
        span.set_attribute("durable.task.id", "t")
    provider.force_flush()
    assert [(s.name, dict(s.attributes or {})) for s in exported.get_finished_spans()] == [
        ("recorded", {"durable.task.id": "t"})
    ]
    provider.shutdown()


@pytest.mark.parametrize("name", ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"])
def test_either_endpoint_means_exporting(monkeypatch, name):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert not otel.exporting()
    monkeypatch.setenv(name, "http://127.0.0.1:4318")
    assert otel.exporting()
