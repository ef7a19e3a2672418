"""OpenTelemetry: Django requests, Celery tasks, and the durable work in between.

Spans of our own, each with ``durable.*`` attributes (ids, types, versions, counts; never
input, facts, effects, prompts or answers): ``task.transition`` (tasks.transitions),
``lease.claim`` / ``lease.takeover`` / ``lease.expire`` (tasks.leases), ``task.run``
(runtime.runner: it continues the trace whose ``traceparent`` the checkpoint holds),
``task.resume_validation``, ``action.dispatch``, ``action.reconcile``, ``approval.decide``
and ``chat <model>`` (runtime.llm, GenAI conventions).

Spans always get ids (the audit log records each transition's trace id); they
are exported over OTLP/HTTP only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set. Without it the spans carry their
ids and nothing else (``IdsOnlyTracerProvider``): recording the attributes,
times and events of spans nobody exports was a twentieth of a worker's CPU.
``OTEL_SDK_DISABLED=true`` turns all of it off. Database spans (psycopg) are
opt-in with ``OTEL_INSTRUMENT_DB=true``: they cost CPU on every query.

Every span leaves the process redacted (``audit.redaction``): its attributes,
its events (recorded exceptions with their messages) and its status text, so a
credential in a URL, a header or an exception message is never exported.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Status
from opentelemetry.util import types

from audit.redaction import redact, redact_value

_configured = False


def configure(*, celery: bool = False) -> None:
    global _configured
    if _configured or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    _configured = True
    trace.set_tracer_provider(tracer_provider(exporting=exporting()))

    from django.conf import settings
    from opentelemetry.instrumentation.django import DjangoInstrumentor

    # Read the settings first: the instrumentor swallows a refusal to start (ImproperlyConfigured, e.g.
    # no SECRET_KEY with DEBUG off) and carries on with empty settings, serving nothing but errors.
    middleware = list(settings.MIDDLEWARE)  # loads the settings, and raises their refusal here
    # Its middleware goes right after the health probes' (config.health), not first: it builds the
    # request's absolute URL, which validates the host, and a probe addressed by IP (a Kubernetes
    # probe sends ``Host: <pod ip>``) would get a 400 instead of its answer. Probes are not traced.
    health = "config.health.HealthMiddleware"
    position = middleware.index(health) + 1 if health in middleware else 0
    DjangoInstrumentor().instrument(middleware_position=position)
    if celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        # Its __init__ has no return annotation, so mypy counts it untyped; it takes no arguments.
        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    if os.environ.get("OTEL_INSTRUMENT_DB", "").lower() == "true":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument()

    # Metrics: the meter provider behind /metrics and every durable_* instrument (config/metrics.py).
    from config import metrics

    metrics.configure()


def exporting() -> bool:
    """Whether spans leave this process: an OTLP endpoint is set."""
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def tracer_provider(*, exporting: bool) -> trace.TracerProvider:
    """The SDK's provider exporting redacted spans over OTLP/HTTP; without an exporter, ids only."""
    if not exporting:
        return IdsOnlyTracerProvider()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "durable-agents")})
    )
    provider.add_span_processor(BatchSpanProcessor(RedactingExporter(OTLPSpanExporter())))
    return provider


SAMPLED = trace.TraceFlags(trace.TraceFlags.SAMPLED)


class IdsOnlyTracer(trace.NoOpTracer):
    """Spans with ids as the SDK gives them (a new trace sampled, a child in its parent's trace with
    its flags) that record nothing: what the audit log (trace id) and a checkpoint (traceparent a
    later run continues) need, at a fraction of the SDK span's cost."""

    def __init__(self) -> None:
        self.ids = RandomIdGenerator()

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: trace.SpanKind = trace.SpanKind.INTERNAL,
        attributes: types.Attributes = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:  # the SDK's default sampler follows the parent's decision
            trace_id, flags, state = parent.trace_id, parent.trace_flags, parent.trace_state
        else:
            trace_id, flags, state = self.ids.generate_trace_id(), SAMPLED, None
        span_id = self.ids.generate_span_id()
        return trace.NonRecordingSpan(trace.SpanContext(trace_id, span_id, False, flags, state))


class IdsOnlyTracerProvider(trace.TracerProvider):
    """Every tracer of a process that exports no spans: ``IdsOnlyTracer``."""

    def __init__(self) -> None:
        self.tracer = IdsOnlyTracer()

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: types.Attributes = None,
    ) -> trace.Tracer:
        return self.tracer


class RedactingExporter(SpanExporter):
    """A span exporter that hands ``inner`` copies of the spans with every text redacted."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([redacted_span(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def redacted_span(span: ReadableSpan) -> ReadableSpan:
    """A copy of a finished span whose attributes, events and status text are redacted."""
    status = span.status
    if status.description:
        status = Status(status.status_code, redact(status.description))
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=redact_value(dict(span.attributes or {})),
        events=[Event(e.name, redact_value(dict(e.attributes or {})), e.timestamp) for e in span.events],
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
