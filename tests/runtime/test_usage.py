"""Token usage and cost per model turn and per task (``runtime.usage``, ``runtime.ModelUsage``).

Each turn the endpoint counted leaves one row, committed with the transition after it; the task's
figures (``reads.task_detail``, the API's ``usage``, the task page) are the sums of those rows.
In-process resume loops on PostgreSQL with a metered test model; no endpoint, no network.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, transaction
from django.db.models import Sum
from django.test import Client
from pydantic import BaseModel

from config import settings as config_settings
from reads.task_detail import Sections, read_task_detail
from runtime import controls, engine, runner, sweep, usage
from runtime.llm import ModelUnavailable, Reply
from runtime.models import ModelUsage
from tasks import registry
from tasks.models import Task
from tasks.registry import Complete, ModelTurn, TaskType
from tasks.states import State
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db(transaction=True)

PRICED = "metered-v1"
PRICES = {PRICED: (Decimal("2"), Decimal("8"))}  # per 1M tokens: in, out
NUL = "\x00"
EVERYTHING = Sections(
    children=None, cancel_requests=None, reruns=None, pending_approvals=None, approvals=None, actions=None
)


class Nothing(BaseModel):
    """The input of a type that needs none."""


TWO_TURNS = TaskType(
    name="two_turns",
    description="two model turns, then done",
    input_model=Nothing,
    max_attempts=4,
    backoff=timedelta(milliseconds=1),
    scripts={"think@1": lambda facts: "fine", "answer@1": lambda facts: "ok"},
    steps=(
        ModelTurn("think", next="answer", prompt_id="think@1", output="thought"),
        ModelTurn("answer", next="done", prompt_id="answer@1", output="answer"),
        Complete("done", outcome=("thought", "answer")),
    ),
)


class Metered:
    """A model that plays a script of replies and failures, one per turn, counting what it was asked."""

    def __init__(self, *turns: Reply | Exception, model_id: str = PRICED):
        self.model_id = model_id
        self.turns = list(turns)

    def complete(self, *, prompt_id: str, system: str, facts: Mapping[str, Any]) -> Reply:
        turn = self.turns.pop(0)
        if isinstance(turn, Exception):
            raise turn
        return turn


@pytest.fixture(autouse=True)
def two_turns(settings):
    settings.MODEL_PRICES = PRICES
    registry.register(TWO_TURNS)
    yield TWO_TURNS
    registry._REGISTRY.pop(TWO_TURNS.name)  # a test's throwaway type


def start(acme) -> Task:
    return make_task(acme, task_type=TWO_TURNS.name, objective="think twice", input={})


def run_to_the_end(task: Task, model: Metered) -> Task:
    """Run the task, ending each retry wait as the sweep would, until it stops retrying."""
    for _ in range(10):
        runner.run_task(task.id, worker_id="w", region="default", model=model)
        task = Task.objects.get(pk=task.pk)
        if task.state != State.WAITING_RETRY:
            return task
        sweep.sweep(lambda task_id, region: None, now=task.wait_deadline + timedelta(seconds=1))
    raise AssertionError("the task kept retrying")


def totals(task: Task, user) -> Any:
    return read_task_detail(task, user=user, sections=EVERYTHING).usage


def test_the_task_figures_equal_the_sum_of_its_recorded_usages_over_retried_turns(acme, operator):
    model = Metered(
        Reply("fine", PRICED, 1000, 10),
        ModelUnavailable("down"),  # no answer, no usage
        Reply(f"o{NUL}k", PRICED, 400, 5),  # refused, but billed
        Reply("ok", PRICED, 500, 20),
    )
    task = run_to_the_end(start(acme), model)
    assert task.state == State.COMPLETED and model.turns == []
    rows = ModelUsage.objects.filter(task=task).order_by("state_version")
    assert [(r.step, r.committed, r.input_tokens, r.output_tokens) for r in rows] == [
        ("think", True, 1000, 10),
        ("answer", False, 400, 5),
        ("answer", True, 500, 20),
    ]
    assert [r.attempt for r in rows] == [0, 1, 2]  # the retried turn is recorded per attempt
    sums = rows.aggregate(i=Sum("input_tokens"), o=Sum("output_tokens"), c=Sum("cost"))
    figures = totals(task, operator)
    assert (figures.turns, figures.input_tokens, figures.output_tokens, figures.cost) == (
        3, sums["i"], sums["o"], sums["c"]
    )  # fmt: skip
    assert figures.input_tokens == 1900 and figures.output_tokens == 35


def test_each_turn_is_priced_from_model_prices_per_million_tokens(acme, operator):
    task = run_to_the_end(start(acme), Metered(Reply("fine", PRICED, 1000, 10), Reply("ok", PRICED, 500, 20)))
    costs = list(
        ModelUsage.objects.filter(task=task).order_by("state_version").values_list("cost", flat=True)
    )
    assert costs == [Decimal("0.00208"), Decimal("0.00116")]  # 1000×2 + 10×8, 500×2 + 20×8, per 1M
    assert totals(task, operator).cost == Decimal("0.00324")


def test_a_model_without_a_price_records_its_tokens_and_no_cost(acme, operator):
    other = "unlisted-v0"
    task = run_to_the_end(
        start(acme), Metered(Reply("fine", other, 30, 3), Reply("ok", other, 40, 4), model_id=other)
    )
    assert list(ModelUsage.objects.filter(task=task).values_list("cost", flat=True)) == [None, None]
    figures = totals(task, operator)
    assert (figures.input_tokens, figures.output_tokens, figures.cost, figures.unpriced) == (70, 7, None, 2)


def test_one_unpriced_turn_leaves_the_task_cost_unknown_rather_than_partial(acme, operator):
    task = run_to_the_end(
        start(acme), Metered(Reply("fine", PRICED, 1000, 10), Reply("ok", PRICED, None, None))
    )
    figures = totals(task, operator)
    assert (figures.turns, figures.cost, figures.unpriced) == (2, None, 1)


def test_cost_is_none_for_an_unknown_model_or_unknown_counts(settings):
    assert usage.cost(PRICED, 1_000_000, 0) == Decimal(2)
    assert usage.cost("nobody", 10, 10) is None
    assert usage.cost(PRICED, None, 10) is None


def test_a_turn_whose_transition_is_refused_leaves_no_usage_row(acme, admin_user, monkeypatch):
    """The usage commits with the turn's transition: a stale version on the advance commits neither."""
    real_decide = engine.decide

    def decide_then_lose_the_race(task, checkpoint, **kwargs):
        decision = real_decide(task, checkpoint, **kwargs)
        controls.task_control(
            task, "escalate", user=admin_user, roles=frozenset({"admin"}),
            expected_version=task.state_version, reason="meanwhile",
        )  # fmt: skip
        return decision

    monkeypatch.setattr(engine, "decide", decide_then_lose_the_race)
    task = start(acme)
    outcome = runner.run_task(
        task.id, worker_id="w", region="default", model=Metered(Reply("fine", PRICED, 9, 9))
    )
    assert outcome == "stale_version"
    assert not ModelUsage.objects.filter(task=task).exists()


def test_a_turn_that_fails_before_answering_records_nothing(acme):
    task = start(acme)
    runner.run_task(task.id, worker_id="w", region="default", model=Metered(ModelUnavailable("down")))
    assert Task.objects.get(pk=task.pk).state == State.WAITING_RETRY
    assert not ModelUsage.objects.filter(task=task).exists()


def test_the_api_detail_shows_the_task_usage(acme, operator):
    task = run_to_the_end(start(acme), Metered(Reply("fine", PRICED, 1000, 10), Reply("ok", PRICED, 500, 20)))
    body = api_client_for(operator).get(f"/api/tasks/{task.id}/").json()
    assert body["usage"] == {
        "turns": 2, "input_tokens": 1500, "output_tokens": 30, "cost": "0.003240000000", "unpriced": 0,
    }  # fmt: skip


def test_the_task_page_shows_the_task_usage(acme, operator):
    task = run_to_the_end(start(acme), Metered(Reply("fine", PRICED, 1000, 10), Reply("ok", PRICED, 500, 20)))
    client = Client()
    client.force_login(operator)
    page = client.get(f"/console/tasks/{task.id}/").content.decode()
    assert "2 turns · 1500 tokens in, 30 out · cost 0.003240" in page


def test_the_scripted_model_reports_the_same_token_counts_every_run(acme, operator):
    """The demo's model counts tokens, so its tasks show figures, and the same ones each time."""
    first, second = start(acme), start(acme)
    for task in (first, second):
        runner.run_task(task.id, worker_id="w", region="default")
    a, b = totals(first, operator), totals(second, operator)
    assert a.turns == 2 and a.input_tokens > 0 and a.output_tokens > 0
    assert (a.input_tokens, a.output_tokens) == (b.input_tokens, b.output_tokens)


def test_a_recorded_usage_is_append_only_even_for_the_owner(acme):
    task = run_to_the_end(start(acme), Metered(Reply("fine", PRICED, 1000, 10), Reply("ok", PRICED, 500, 20)))
    row = ModelUsage.objects.filter(task=task).first()
    assert row is not None
    for sql in (
        "UPDATE runtime_modelusage SET input_tokens = 0 WHERE id = %s",
        "DELETE FROM runtime_modelusage WHERE id = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [row.pk])
    assert ModelUsage.objects.get(pk=row.pk).input_tokens == 1000


def test_model_prices_are_read_per_model_id_even_one_holding_a_colon():
    assert config_settings._model_prices(" scripted-v1=0.50:1.50, openai-compatible:gpt-4o=2.5:10 ,") == {
        "scripted-v1": (Decimal("0.50"), Decimal("1.50")),
        "openai-compatible:gpt-4o": (Decimal("2.5"), Decimal("10")),
    }


@pytest.mark.parametrize("entry", ["m=1", "m=1:2:3", "m=a:b", "=1:2", "m=-1:2", "m=nan:1", "m"])
def test_a_malformed_price_stops_start_up(entry):
    with pytest.raises(ImproperlyConfigured, match="MODEL_PRICES"):
        config_settings._model_prices(entry)
