"""OpenTelemetry: Django requests, Celery tasks, and a span per transition (tasks.transitions).

Spans always get ids (the audit log records each transition's trace id); they
are exported over OTLP/HTTP only when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set.
``OTEL_SDK_DISABLED=true`` turns all of it off. Database spans (psycopg) are
opt-in with ``OTEL_INSTRUMENT_DB=true``: they cost CPU on every query.
"""

from __future__ import annotations

import os

_configured = False


def configure(*, celery: bool = False) -> None:
    global _configured
    if _configured or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return
    _configured = True
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "durable-agents")})
    )
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)

    from opentelemetry.instrumentation.django import DjangoInstrumentor

    DjangoInstrumentor().instrument()
    if celery:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
    if os.environ.get("OTEL_INSTRUMENT_DB", "").lower() == "true":
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        PsycopgInstrumentor().instrument()
