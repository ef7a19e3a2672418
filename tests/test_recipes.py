"""The README's recipes, each followed once: a throwaway task type and a throwaway connector.

If adding either ever needs more than the README says (one module in
``workflows/``; one class plus one line in ``LEDGER_CONNECTORS``), these fail.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from ledger import connectors
from ledger.connectors.base import Outcome
from ledger.models import Action, DispatchState
from runtime import runner
from tasks import registry
from tasks.models import Task
from tasks.registry import Complete, Dispatch, ModelTurn, TaskType
from tasks.states import State
from tests.conftest import api_client_for

pytestmark = pytest.mark.django_db


class EchoConnector:
    """A whole connector: ``dispatch`` and ``lookup`` by idempotency key (here, an in-memory system)."""

    performed: dict[str, Outcome] = {}

    def __init__(self, name: str):
        self.name = name

    def dispatch(self, key: str, effect: dict[str, Any]) -> Outcome:
        first = key not in self.performed
        if first:
            self.performed[key] = Outcome("succeeded", external_ref=f"echo-{len(self.performed) + 1}")
        return replace(self.performed[key], replayed=not first)

    def lookup(self, key: str) -> Outcome | None:
        return self.performed.get(key)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "protocol": "in-memory"}


class GreetingInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


GREETING = TaskType(
    name="recipe_greeting",
    description="Greet someone and send the greeting: a throwaway type for the README's recipe.",
    input_model=GreetingInput,
    prompt_id="greet@1",
    scripts={"greet@1": lambda facts: f"hello {facts['name']}"},
    steps=(
        ModelTurn("greet", next="send", prompt_id="greet@1", output="greeting", instructions="Greet them."),
        Dispatch(
            "send",
            next="done",
            connector="echo",
            output="echo_ref",
            effect=lambda facts: {"kind": "greeting", "text": facts["greeting"]},
        ),
        Complete("done", outcome=("greeting", "echo_ref")),
    ),
)


@pytest.fixture
def greeting_type(settings):
    """What a module in ``workflows/`` does on import, and the connector's one line of settings."""
    registry.register(GREETING)
    settings.LEDGER_CONNECTORS = {**settings.LEDGER_CONNECTORS, "echo": f"{__name__}.EchoConnector"}
    connectors.get.cache_clear()
    yield GREETING
    registry._REGISTRY.pop(GREETING.name)  # a test's throwaway: no public unregister on purpose
    connectors.get.cache_clear()
    EchoConnector.performed.clear()


def test_every_module_in_workflows_registers_the_task_type_it_is_named_after():
    import workflows

    modules = {module.name for module in pkgutil.iter_modules(workflows.__path__)} - {"apps"}
    assert modules and modules <= set(registry.names())


def test_a_new_task_type_and_connector_run_end_to_end_from_the_api(greeting_type, operator, acme):
    response = api_client_for(operator).post(
        "/api/tasks/",
        {"task_type": "recipe_greeting", "objective": "Greet Ada", "input": {"name": "Ada"}},
        format="json",
    )
    assert response.status_code == 201, response.content
    task_id = response.json()["id"]

    runner.run_task(task_id, worker_id="recipe-worker", region="default")
    task = Task.objects.get(pk=task_id)
    action = Action.objects.get(task=task)
    assert task.state == State.COMPLETED
    assert task.outcome == {"greeting": "hello Ada", "echo_ref": "echo-1"}
    assert (action.connector, action.dispatch_state, action.effect) == (
        "echo",
        DispatchState.SUCCEEDED,
        {"kind": "greeting", "text": "hello Ada"},
    )
    assert importlib.import_module(__name__).EchoConnector.performed.keys() == {action.idempotency_key}
