"""Poisoned outside values: the one storability rule, and what each entry point does with a refusal.

Evidence comes from a stand-in order system over real HTTP (``tests.standin``),
because the sandbox cannot store the values under test; the model is the
scripted one with scripts chosen per test. The backstop tests make a commit
fail for a data reason on purpose and check the worker's resume loop
quarantines the task instead of raising.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import OperationalError
from django.utils import timezone

from audit.models import TransitionEvent
from runtime import engine, evidence, llm, runner
from runtime.llm import Reply, ScriptedModel
from tasks import checkpoints, values
from tasks.decisions import Decision
from tasks.models import ExternalEvent, Task
from tasks.services import latest_checkpoint
from tasks.states import State, Trigger
from tests.conftest import make_task
from tests.standin import RecordServer, record_server

NUL, SURROGATE = "\x00", "\ud800"


def deep(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = [value]
    return value


# --- the rule ---------------------------------------------------------------------------------


def test_ordinary_json_is_storable():
    value = {"status": "delivered", "note": "café ☕ 😀", "n": [1, 2.5, True, None], "nested": {"a": {}}}
    values.check(value)
    assert values.is_storable(value)


def test_a_surrogate_pair_decoded_from_json_is_one_character_and_storable():
    assert values.is_storable(json.loads('{"emoji": "\\ud83d\\ude00"}'))


@pytest.mark.parametrize(
    ("value", "where", "problem"),
    [
        ({"status": f"deliv{NUL}ered"}, "payload.status", "contains a NUL character (at position 5)"),
        ({"a": SURROGATE}, "payload.a", "contains a lone surrogate U+D800 (at position 0)"),
        ({"a": ["ok", {"b": f"x{NUL}"}]}, "payload.a[1].b", "contains a NUL character"),
        ({f"bad{NUL}key": 1}, "payload", "has a key 'bad\\u0000key' that contains a NUL character"),
        ({SURROGATE: 1}, "payload", "has a key '\\ud800' that contains a lone surrogate U+D800"),
        ({"x": float("nan")}, "payload.x", "is nan, not a JSON number"),
        ({"x": float("inf")}, "payload.x", "is inf, not a JSON number"),
        ({1: "a"}, "payload", "has a key that is not text (int)"),
        ({"x": b"bytes"}, "payload.x", "is a bytes, not a JSON value"),
        ({"x": deep(values.MAX_DEPTH)}, "payload.x" + "[0]" * (values.MAX_DEPTH - 1), "nested more than"),
    ],
    ids=[
        "nul-value",
        "surrogate-value",
        "nested",
        "nul-key",
        "surrogate-key",
        "nan",
        "inf",
        "int-key",
        "bytes",
        "too-deep",
    ],
)
def test_an_unstorable_value_is_refused_with_its_path_and_problem(value, where, problem):
    with pytest.raises(values.Unstorable) as refused:
        values.check(value, "payload")
    assert refused.value.where == where
    assert problem in refused.value.problem


def test_the_first_problem_in_document_order_is_the_one_reported():
    with pytest.raises(values.Unstorable) as refused:
        values.check({"a": "fine", "b": [f"{NUL}", SURROGATE], "c": NUL}, "body")
    assert refused.value.where == "body.b[0]"


def test_a_value_nested_far_beyond_the_recursion_limit_is_walked_without_recursing():
    values.check(deep(20_000), max_depth=30_000)  # RecursionError here would be a 500 in the API


def test_printable_escapes_exactly_what_text_columns_cannot_hold():
    cleaned = values.printable(f"a{NUL}b{SURROGATE}c é")
    assert cleaned == "a\\u0000b\\ud800c é"
    assert values.is_storable(cleaned)
    cleaned.encode("utf-8")  # a lone surrogate would raise here, as psycopg does


def test_printable_bounds_long_text():
    assert values.printable("x" * 50, 10) == "x" * 10 + "…"


# --- as_fact: outside values becoming facts --------------------------------------------------


@pytest.mark.parametrize(
    "value", [f"deliv{NUL}ered", SURROGATE, float("nan")], ids=["nul", "surrogate", "nan"]
)
def test_as_fact_refuses_a_value_no_column_can_hold(value):
    with pytest.raises(values.Unstorable):
        checkpoints.as_fact(value)


def test_as_fact_turns_a_non_scalar_into_text_with_its_poison_escaped():
    fact = checkpoints.as_fact({"a": f"b{NUL}", "c": SURROGATE})
    assert isinstance(fact, str) and values.is_storable(fact)


# --- evidence ---------------------------------------------------------------------------------


@pytest.fixture
def orders(settings) -> Iterator[RecordServer]:
    with record_server() as records:
        settings.CONNECTOR_URLS = {**settings.CONNECTOR_URLS, "orders": records.url}
        yield records


def test_evidence_facts_name_the_system_record_and_field_that_cannot_be_stored(orders):
    orders.put("O-1", {"status": f"deliv{NUL}ered", "total": "10.00"})
    record = evidence.fetch("orders", "O-1", tenant="acme")
    with pytest.raises(evidence.EvidenceUnstorable) as refused:
        evidence.facts_from(record, {"total": "order_total", "status": "order_status"})
    assert (
        str(refused.value) == "orders record 'O-1': field 'status' contains a NUL character (at position 5)"
    )


def test_evidence_whose_version_cannot_be_stored_is_refused(orders):
    orders.put("O-1", {"status": "delivered"}, version=f"v{SURROGATE}")
    with pytest.raises(evidence.EvidenceUnstorable, match="field 'version' contains a lone surrogate"):
        evidence.fetch("orders", "O-1", tenant="acme")


def test_evidence_fields_a_step_does_not_take_are_not_judged(orders):
    orders.put("O-1", {"status": "delivered", "notes": f"x{NUL}"})
    facts = evidence.facts_from(evidence.fetch("orders", "O-1", tenant="acme"), {"status": "order_status"})
    assert facts == {"order_status": "delivered"}


def lookup_task(tenant, order_id: str = "O-1") -> Task:
    return make_task(
        tenant, task_type="order_lookup", objective=f"Look up {order_id}", input={"order_id": order_id}
    )


def run(task: Task, model: llm.Model | None = None) -> tuple[str, Task]:
    stopped = runner.run_task(task.id, worker_id="w", region="default", model=model)
    return stopped, Task.objects.get(pk=task.pk)


def last_event(task: Task) -> TransitionEvent:
    return TransitionEvent.objects.filter(task=task).latest("state_version")


@pytest.mark.django_db(transaction=True)
def test_a_record_with_a_nul_in_a_fact_quarantines_its_task_naming_the_field(acme, orders):
    orders.put("O-1", {"status": f"deliv{NUL}ered"})
    stopped, task = run(lookup_task(acme))
    assert (stopped, task.state, task.state_reason) == (
        State.QUARANTINED,
        State.QUARANTINED,
        "evidence_unstorable",
    )
    assert (
        last_event(task).reason
        == "orders record 'O-1': field 'status' contains a NUL character (at position 5)"
    )


@pytest.mark.django_db(transaction=True)
def test_a_record_with_a_lone_surrogate_in_a_fact_quarantines_its_task(acme, orders):
    orders.put_raw("O-1", '{"id": "O-1", "version": 1, "data": {"status": "\\ud800"}}')
    stopped, task = run(lookup_task(acme))
    assert (task.state, task.state_reason) == (State.QUARANTINED, "evidence_unstorable")
    assert "field 'status' contains a lone surrogate U+D800" in last_event(task).reason


@pytest.mark.django_db(transaction=True)
def test_a_clean_record_still_completes_the_lookup(acme, orders):
    orders.put("O-1", {"status": "delivered", "notes": f"internal{NUL}"})
    stopped, task = run(lookup_task(acme))
    assert task.state == State.COMPLETED
    assert task.outcome["order_status"] == "delivered"


# --- model output -----------------------------------------------------------------------------


def test_accepted_model_output_is_trimmed_and_bounded():
    reply = llm.accepted(Reply("  refund \n" + "x" * 5000, "m"))
    assert reply.text.startswith("refund") and len(reply.text) == checkpoints.MAX_FACT_LENGTH


@pytest.mark.parametrize(
    ("reply", "where"),
    [(Reply(f"ref{NUL}und", "m"), "answer"), (Reply("ok", f"m{SURROGATE}"), "model id")],
    ids=["answer", "model-id"],
)
def test_model_output_that_cannot_be_stored_is_refused_without_quoting_it(reply, where):
    with pytest.raises(llm.ModelOutputInvalid) as refused:
        llm.accepted(reply)
    assert f"the {where} contains" in str(refused.value)
    assert values.is_storable(str(refused.value))


@pytest.mark.django_db(transaction=True)
def test_a_model_answer_with_a_nul_is_refused_and_the_turn_retried_later(acme, orders):
    orders.put("O-1", {"status": "delivered"})
    model = ScriptedModel({"order-lookup@1": lambda facts: f"order is deliv{NUL}ered"})
    stopped, task = run(lookup_task(acme), model)
    assert (task.state, task.state_reason) == (State.WAITING_RETRY, "model_output_invalid")
    assert "summary" not in latest_checkpoint(task).facts


# --- the backstop: a commit refused for the task's data ---------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_commit_refused_with_a_data_error_quarantines_the_task_and_returns(acme, orders, monkeypatch):
    # Bypass the gate so a NUL reaches the outcome (jsonb): the commit itself must fail.
    monkeypatch.setattr(engine.llm, "accepted", lambda reply: reply)
    orders.put("O-1", {"status": "delivered"})
    model = ScriptedModel({"order-lookup@1": lambda facts: f"deliv{NUL}ered"})
    stopped, task = run(lookup_task(acme), model)
    assert (stopped, task.state, task.state_reason) == ("step_error", State.QUARANTINED, "step_error")
    reason = last_event(task).reason
    assert reason.startswith("DataError: ") and "LINE" not in reason  # the cause, not the SQL


@pytest.mark.django_db(transaction=True)
def test_a_step_error_quoting_poisoned_data_still_quarantines_with_a_clean_reason(acme, monkeypatch):
    # The quarantine's own reason would carry the NUL into the audit log and fail like the step did.
    def blows_up(task, checkpoint, **kwargs):
        raise ValueError(f"unexpected status 'deliv{NUL}ered'")

    monkeypatch.setattr(engine, "decide", blows_up)
    stopped, task = run(make_task(acme))
    assert (stopped, task.state) == ("step_error", State.QUARANTINED)
    assert last_event(task).reason == "ValueError: unexpected status 'deliv\\u0000ered'"


@pytest.mark.django_db(transaction=True)
def test_a_commit_breaking_a_unique_constraint_quarantines_the_task(acme, monkeypatch):
    task = make_task(acme)
    ExternalEvent.objects.create(
        task=task, event_key="k", event_type="t", payload={}, received_at=timezone.now()
    )

    def duplicate(task, checkpoint, **kwargs):
        again = ExternalEvent(
            task=task, event_key="k", event_type="t", payload={}, received_at=timezone.now()
        )
        return Decision(State.READY, Trigger.STEP, checkpoint.progress, records=(again,))

    monkeypatch.setattr(engine, "decide", duplicate)
    stopped, task = run(task)
    assert (stopped, task.state) == ("step_error", State.QUARANTINED)
    assert last_event(task).reason.startswith("IntegrityError: ")


@pytest.mark.django_db(transaction=True)
def test_a_lost_database_connection_still_reaches_the_workers_loop(acme, monkeypatch):
    def connection_lost(task, checkpoint, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(engine, "decide", connection_lost)
    task = make_task(acme)
    with pytest.raises(OperationalError):
        runner.run_task(task.id, worker_id="w", region="default")
    assert Task.objects.get(pk=task.pk).state == State.READY
