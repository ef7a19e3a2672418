"""The SDK's spans of an agent step join our OpenTelemetry trace, without the conversation."""

from __future__ import annotations

import pytest
from agents import set_tracing_disabled
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runtime.sdk import tracing
from tests.sdk.test_support_agent import run_until_still, sandbox, support_task  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def ancestors(span, by_id) -> list[str]:
    names = []
    while span.parent is not None and span.parent.span_id in by_id:
        span = by_id[span.parent.span_id]
        names.append(span.name)
    return names


@pytest.fixture
def spans(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "tracer", provider.get_tracer("runtime.sdk"))
    set_tracing_disabled(False)  # whatever ran before in this process, the SDK traces into the bridge
    tracing.install()
    return exporter


def test_the_sdk_spans_of_a_run_are_opentelemetry_spans_nested_as_the_sdk_nests_them(acme, spans):
    task = run_until_still(support_task(acme))
    assert task.state == "completed"

    finished = spans.get_finished_spans()
    names = {span.name for span in finished}
    assert {"agent.agent support", "agent.function refund_order", "agent.function email_customer"} <= names
    by_id = {span.context.span_id: span for span in finished}
    calls = [span for span in finished if span.name.startswith("agent.function")]
    assert calls and all("agent.agent support" in ancestors(c, by_id) for c in calls)
    chats = [span for span in finished if span.name == "chat scripted-support-v1"]
    assert len(chats) == 4  # one per turn the model was asked: replayed turns are not asked again
    assert all(chat.attributes["gen_ai.usage.input_tokens"] > 0 for chat in chats)
    agent = next(span for span in finished if span.name == "agent.agent support")
    assert set(agent.attributes["durable.sdk.tools"]) == {"lookup_order", "refund_order", "email_customer"}
    # Names and shapes only: no order id, amount or e-mail address reaches a span.
    for span in finished:
        assert not any(
            "A-1" in str(value) or "example.com" in str(value) for value in span.attributes.values()
        )
