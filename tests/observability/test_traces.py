"""Traces of the durable work: which spans a task's life produces, what they say and what they never say.

A refund (``refund_request``) runs to completion in-process against the sandbox over
real HTTP, every wait answered as a person or a system would; the spans go to an
in-memory exporter. The customer's card and address, what they wrote, the model's
instructions and the deployment's secrets appear in no span.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from audit.models import TransitionEvent
from ledger.models import Action, DispatchState
from runtime import runner
from runtime.llm import OpenAICompatibleModel
from runtime.reconcile import reconcile_unknown
from tasks import registry, services
from tasks.models import Task
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import make_task
from tests.runtime.payments import fault, invoice_task
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)

# Every module that opens spans of its own (each holds a module-level ``tracer``).
TRACED = (
    "tasks.transitions",
    "tasks.leases",
    "runtime.runner",
    "runtime.validation",
    "runtime.dispatch",
    "runtime.reconcile",
    "runtime.llm",
    "approvals.services",
)
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")
CARD = "visa-4242-7719"
EMAIL = "jane.doe@customer.example"
WROTE = "the box arrived crushed"
DAMAGED = "cracked teapot lid"
REFUND = {"order_id": "A-1", "customer_email": EMAIL, "amount": "10.00", "currency": "USD", "reason": WROTE}


def install_tracing(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    """Point every traced module at a provider of its own that keeps finished spans in memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in TRACED:
        monkeypatch.setattr(importlib.import_module(name), "tracer", provider.get_tracer(name))
    return exporter


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = install_tracing(monkeypatch)
    yield exporter
    exporter.shutdown()


@pytest.fixture
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    put_order("A-1", card=CARD)


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="test-worker", region="default")
    return Task.objects.get(pk=task.pk)


def refund_to_completion(tenant, owner, approver) -> Task:
    """A refund driven through every wait — input, a return shipment, an approval — to completed."""
    task = run(make_task(tenant, owner=owner, input=REFUND))
    assert task.state == State.WAITING_INPUT, task.state
    services.task_provide_input(task, expected_version=task.state_version, answer=DAMAGED, actor=INTEGRATOR)
    task = run(task)
    assert task.state == State.WAITING_EXTERNAL, task.state
    services.task_deliver_event(
        task,
        event_key=f"ship-{task.id}",
        event_type="shipment.returned",
        payload={"tracking_number": "TRK-1"},
        actor=INTEGRATOR,
    )
    task = run(task)
    assert task.state == State.WAITING_APPROVAL, task.state
    approve(task, approver)
    task = run(task)
    assert task.state == State.COMPLETED, task.state
    return task


def in_order(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return sorted(exporter.get_finished_spans(), key=lambda span: span.start_time or 0)


def trace_hex(span: ReadableSpan) -> str:
    return format(span.context.trace_id, "032x")


def everything_said(span: ReadableSpan) -> list[str]:
    """Every text a span carries: name, attributes, events' and links' attributes, status."""
    values: list[Any] = [span.name, span.status.description or ""]
    values += list((span.attributes or {}).values())
    for event in span.events:
        values += [event.name, *(event.attributes or {}).values()]
    for link in span.links:
        values += list((link.attributes or {}).values())
    return [str(value) for value in values]


def test_a_refund_run_to_completion_leaves_its_spans_in_order(sandbox, spans, acme, operator, approver):
    refund_to_completion(acme, operator, approver)
    names = [span.name for span in in_order(spans)]
    # Each worker pass: its claim, its run, and inside it the step's own work and its transition.
    run_ = ["lease.claim", "task.run"]
    assert names == [
        "task.transition",  # created
        *run_, "task.transition", "chat scripted-v1", "task.transition", "task.transition",  # -> input
        "task.transition",  # the answer
        *run_, "task.resume_validation", "task.transition", "task.transition",  # -> return shipment
        "task.transition",  # the shipment event
        *run_, "task.resume_validation", "task.transition", "task.transition",  # -> approval
        "approval.decide", "task.transition",
        *run_, "task.resume_validation", "task.transition",
        # Each side effect: the intent committed, then sent, then its answer recorded.
        "task.transition", "action.dispatch", "task.transition",  # the ticket
        "task.transition", "action.dispatch", "task.transition",  # the refund
        "task.transition", "action.dispatch", "task.transition",  # the notice
        "task.transition",  # completed
    ]  # fmt: skip


def test_each_transition_span_names_its_task_edge_and_version_as_the_audit_log_does(
    sandbox, spans, acme, operator, approver
):
    task = refund_to_completion(acme, operator, approver)
    transitions = [span for span in in_order(spans) if span.name == "task.transition"]
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    assert [
        (
            span.attributes["durable.transition.trigger"],
            span.attributes["durable.transition.from_state"],
            span.attributes["durable.transition.to_state"],
            span.attributes["durable.task.state_version"],
        )
        for span in transitions
    ] == [(e.trigger, e.from_state, e.to_state, e.state_version) for e in events]
    for span, event in zip(transitions, events, strict=True):
        assert trace_hex(span) == event.trace_id  # the audit log points at this very trace
        assert span.attributes["durable.task.id"] == str(task.id)
        assert span.attributes["durable.task.type"] == "refund_request"
        assert span.attributes["durable.tenant.id"] == acme.pk
        assert span.attributes["durable.task.attempt"] == event.attempt


def test_the_step_spans_say_what_was_decided_without_saying_what_was_in_it(
    sandbox, spans, acme, operator, approver
):
    refund_to_completion(acme, operator, approver)
    finished = in_order(spans)
    [model] = [span for span in finished if span.name.startswith("chat ")]
    assert model.attributes["gen_ai.operation.name"] == "chat"
    assert (
        model.attributes["gen_ai.request.model"] == model.attributes["gen_ai.response.model"] == "scripted-v1"
    )
    verdicts = [
        s.attributes["durable.validation.verdict"] for s in finished if s.name == "task.resume_validation"
    ]
    assert verdicts == ["proceed", "proceed", "proceed"]
    [decision] = [span for span in finished if span.name == "approval.decide"]
    assert decision.attributes["durable.approval.decision"] == "approve"
    assert decision.attributes["durable.approval.outcome"] == "applied"
    sends = [span.attributes for span in finished if span.name == "action.dispatch"]
    assert [(a["durable.action.connector"], a["durable.action.state"]) for a in sends] == [
        ("tickets", "succeeded"),
        ("payments", "succeeded"),
        ("email", "succeeded"),
    ]
    keys = list(Action.objects.order_by("id").values_list("idempotency_key", flat=True))
    assert all(len(a["durable.action.key_hash"]) == 16 for a in sends)
    assert not any(key in text for span in finished for text in everything_said(span) for key in keys)


def test_no_span_carries_a_sensitive_value_a_prompt_or_a_secret(
    sandbox, spans, acme, operator, approver, settings
):
    refund_to_completion(acme, operator, approver)
    instructions = registry.get("refund_request").step("triage").instructions
    forbidden = [CARD, EMAIL, WROTE, DAMAGED, instructions, settings.SECRET_KEY, settings.SANDBOX_TOKEN]
    said = [text for span in spans.get_finished_spans() for text in everything_said(span)]
    assert said  # the scan looked at something
    for value in forbidden:
        assert not [text for text in said if value in text], value


def test_the_first_worker_run_continues_the_trace_that_created_the_task(sandbox, spans, acme, operator):
    task = run(make_task(acme, owner=operator, input=REFUND))
    created = TransitionEvent.objects.get(task=task, state_version=1)
    start = next(span for span in in_order(spans) if span.name == "task.transition")
    [worker] = [span for span in in_order(spans) if span.name == "task.run"]
    assert trace_hex(worker) == created.trace_id == trace_hex(start)
    assert worker.parent is not None and worker.parent.span_id == start.context.span_id
    assert worker.attributes["durable.worker.id"] == "test-worker"
    assert worker.attributes["durable.run.outcome"] == State.WAITING_INPUT
    # Everything the run did is in that trace.
    assert {trace_hex(span) for span in spans.get_finished_spans() if span.name != "lease.claim"} == {
        created.trace_id
    }


def test_a_run_long_after_the_request_that_woke_it_starts_its_own_trace_linked_to_it(
    sandbox, spans, acme, operator, monkeypatch
):
    monkeypatch.setattr(runner, "CONTINUE_TRACE_WITHIN", timedelta(0))  # "long" is anything now
    task = run(make_task(acme, owner=operator, input=REFUND))
    created = TransitionEvent.objects.get(task=task, state_version=1)
    [worker] = [span for span in spans.get_finished_spans() if span.name == "task.run"]
    assert trace_hex(worker) != created.trace_id and worker.parent is None
    [link] = worker.links
    assert format(link.context.trace_id, "032x") == created.trace_id


def test_a_reconciliation_says_what_it_found(live_server, settings, spans, acme):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    fault("timeout", seconds=1)  # the payment is made; its answer is lost
    task = run(invoice_task(acme))
    assert task.state == State.OUTCOME_UNKNOWN
    assert reconcile_unknown() == 1
    [looked] = [span for span in spans.get_finished_spans() if span.name == "action.reconcile"]
    assert looked.attributes["durable.reconcile.result"] == DispatchState.RECONCILED_SUCCEEDED
    assert looked.attributes["durable.action.connector"] == "payments"
    assert looked.attributes["durable.task.id"] == str(task.id)


def test_a_model_turn_records_the_model_and_its_token_counts_but_not_the_conversation(spans):
    def endpoint(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200,
            json={
                "model": "gpt-test-2",
                "choices": [{"message": {"content": "refund"}}],
                "usage": {"prompt_tokens": 41, "completion_tokens": 2},
            },
        )

    model = OpenAICompatibleModel(
        base_url="https://models.example/v1",
        model="gpt-test",
        api_key="sk-live-abcdefghijklmnop",
        transport=httpx.MockTransport(endpoint),
    )
    reply = model.complete(
        prompt_id="refund-triage@1", system="Say refund or escalate.", facts={"amount": "10.00"}
    )
    assert reply.text == "refund"
    [turn] = spans.get_finished_spans()
    assert turn.name == "chat gpt-test"
    assert dict(turn.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-test",
        "gen_ai.response.model": "openai-compatible:gpt-test-2",
        "gen_ai.usage.input_tokens": 41,
        "gen_ai.usage.output_tokens": 2,
        "durable.prompt_id": "refund-triage@1",
    }


def test_the_task_page_links_to_its_traces_only_when_a_trace_url_is_configured(
    sandbox, spans, acme, operator, client, settings
):
    task = run(make_task(acme, owner=operator, input=REFUND))
    created = TransitionEvent.objects.get(task=task, state_version=1).trace_id
    latest = TransitionEvent.objects.get(task=task, state_version=task.state_version).trace_id
    client.force_login(operator)
    page = client.get(f"/console/tasks/{task.id}/").content.decode()
    assert "tempo.example" not in page and ">Trace<" not in page
    settings.TRACE_URL_TEMPLATE = "https://tempo.example/trace/{trace_id}"
    page = client.get(f"/console/tasks/{task.id}/").content.decode()
    assert f'href="https://tempo.example/trace/{created}"' in page
    assert created == latest  # the worker's run continued the creating trace: one link
    assert page.count("https://tempo.example/trace/") == 1
