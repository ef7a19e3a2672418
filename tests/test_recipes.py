"""The four recipes of docs/building/recipe.md, each followed once with a throwaway: a task type,
a connector, a console page and an operator control.

If adding one ever needs more than the recipe says (one module in
``workflows/``; one class plus one line in ``LEDGER_CONNECTORS``; a view, a URL
and a template; an edge in the table and a name in ``CONTROLS``), these fail.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from dataclasses import replace
from typing import Any

import pytest
from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.urls import clear_url_caches, path
from pydantic import BaseModel, ConfigDict

from console.access import tenant_ids_or_403
from ledger import connectors
from ledger.connectors.base import Outcome
from ledger.models import Action, DispatchState
from reads import visibility
from runtime import controls, runner
from tasks import registry
from tasks.models import Task
from tasks.registry import Complete, Dispatch, ModelTurn, TaskType
from tasks.states import State, Trigger
from tenancy.models import Role
from tenancy.services import grant_role
from tests.conftest import api_client_for, make_task

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

    # Subpackages (``workflows.sdk``: the agents themselves, imported by their first run) are not types.
    found = list(pkgutil.iter_modules(workflows.__path__))
    modules = {module.name for module in found if not module.ispkg} - {"apps"}
    assert modules and modules <= set(registry.names())
    assert {module.name for module in found if module.ispkg} == {"sdk"}


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


# --- a console page: a view, its URL, a template ------------------------------------------------


def _reload_root_urls() -> None:
    """The root URL conf holds the resolvers ``include()`` built at import: rebuild them."""
    importlib.reload(importlib.import_module("config.urls"))  # imported first when this test runs alone
    clear_url_caches()


@login_required
def recipe_page(request):
    """Parse, check access, read (through ``reads/``), render: the shape of every console view. The read
    is narrowed to the tenants the check passed for: a role elsewhere shows nothing of those tenants."""
    tenant_ids = tenant_ids_or_403(request.user, (Role.OPERATOR, Role.ADMIN))
    tasks = visibility.visible_tasks(request.user).filter(tenant_id__in=tenant_ids)
    return render(request, "console/recipe.html", {"tasks": tasks})


@pytest.fixture
def recipe_page_added(monkeypatch, settings, tmp_path):
    import console.urls

    (tmp_path / "console").mkdir()
    (tmp_path / "console" / "recipe.html").write_text(
        '{% extends "base.html" %}{% block content %}<h1>Recipe</h1>{{ tasks|length }} tasks{% endblock %}'
    )
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "DIRS": [tmp_path, *settings.TEMPLATES[0]["DIRS"]]}]
    monkeypatch.setattr(
        console.urls, "urlpatterns", [*console.urls.urlpatterns, path("recipe/", recipe_page, name="recipe")]
    )
    _reload_root_urls()
    yield
    monkeypatch.undo()
    _reload_root_urls()


def test_a_new_console_page_is_a_view_a_url_and_a_template(
    recipe_page_added, client, operator, auditor, acme
):
    make_task(acme)
    client.force_login(operator)
    page = client.get("/console/recipe/")
    assert page.status_code == 200
    assert b"<h1>Recipe</h1>1 tasks" in page.content and b"<nav" in page.content  # inside the layout
    client.force_login(auditor)
    assert client.get("/console/recipe/").status_code == 403


def test_the_new_page_shows_only_the_tenants_its_access_check_passed_for(
    recipe_page_added, client, operator, acme, globex
):
    """An operator of acme who only audits globex: the operators' page lists acme's tasks, not globex's."""
    grant_role(operator, globex, Role.AUDITOR)
    make_task(acme)
    make_task(globex)
    client.force_login(operator)
    assert b"<h1>Recipe</h1>1 tasks" in client.get("/console/recipe/").content


# --- an operator control: an edge in the table, a name in CONTROLS --------------------------------


def _reload_urls() -> None:
    """The API's control routes are built from CONTROLS when its URL module loads."""
    importlib.reload(sys.modules["api.urls"])
    _reload_root_urls()


@pytest.fixture
def hold_control(monkeypatch):
    # The table's edge already exists (quarantine's, which operators may take): only the name is new.
    monkeypatch.setitem(controls.CONTROLS, "hold", Trigger.QUARANTINE)
    _reload_urls()
    yield
    monkeypatch.undo()
    _reload_urls()


def test_a_new_control_is_an_edge_and_a_name_and_the_api_and_console_follow(
    hold_control, client, operator, acme
):
    task = make_task(acme)
    client.force_login(operator)
    assert b"/hold/" in client.get(f"/console/tasks/{task.id}/").content  # the console offers it

    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/hold/", {"expected_version": 1, "reason": "wait for finance"}, format="json"
    )
    assert response.status_code == 200, response.content
    task.refresh_from_db()
    assert (task.state, task.state_reason, task.state_version) == (State.QUARANTINED, "hold", 2)

    stale = api_client_for(operator).post(
        f"/api/tasks/{task.id}/hold/", {"expected_version": 1, "reason": "again"}, format="json"
    )
    assert stale.status_code == 409  # a stale version gets the table's clear conflict, like any control
    assert stale.json()["state"] == State.QUARANTINED
