"""GET /api/tasks/<id>/: tenant scoping, state and version, the controls offered, the ledger summary."""

from __future__ import annotations

import pytest

from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tests.api.conftest import TASKS, url
from tests.conftest import api_client_for, make_task, progress

pytestmark = pytest.mark.django_db


def test_another_tenants_task_detail_answers_404(outsider, acme):
    task = make_task(acme)
    assert api_client_for(outsider).get(url(task)).status_code == 404


def test_an_unknown_task_id_answers_404(operator):
    assert api_client_for(operator).get(f"{TASKS}01a226dd-8447-778e-99ab-449890608930/").status_code == 404


def test_an_unauthenticated_detail_answers_401(acme):
    task = make_task(acme)
    assert api_client_for(None).get(url(task)).status_code == 401


def test_the_detail_shows_state_and_version(operator, acme):
    task = make_task(acme)
    body = api_client_for(operator).get(url(task)).json()
    assert (body["id"], body["state"], body["state_version"]) == (str(task.id), "ready", 1)
    assert body["policy_version"] and body["runtime_config"]["model"]


def test_the_detail_offers_an_operator_the_controls_the_table_allows(operator, acme):
    task = make_task(acme)
    moves = api_client_for(operator).get(url(task)).json()["allowed_transitions"]
    assert {(m["trigger"], m["to_state"]) for m in moves} == {
        ("cancel", "cancel_requested"),
        ("quarantine", "quarantined"),
        ("escalate", "ready"),
    }


def test_the_detail_offers_an_auditor_no_transitions(auditor, acme):
    task = make_task(acme)
    assert api_client_for(auditor).get(url(task)).json()["allowed_transitions"] == []


def test_the_detail_offers_an_approver_no_operator_controls(approver, acme):
    task = make_task(acme)
    assert api_client_for(approver).get(url(task)).json()["allowed_transitions"] == []


def test_the_detail_of_a_new_task_has_an_empty_ledger_summary(operator, acme):
    task = make_task(acme)
    assert api_client_for(operator).get(url(task)).json()["ledger"] == {}


def test_the_detail_counts_ledger_actions_by_dispatch_state(operator, acme):
    task = make_task(acme)
    intents = [
        ActionIntent("refund", "payments", {"amount": "10.00"}),
        ActionIntent("notify", "mail", {"to": "c"}),
    ]
    advance(task.id, 1, State.READY, actor=Actor.worker("w1"), progress=progress(), actions=intents)
    assert api_client_for(operator).get(url(task)).json()["ledger"] == {"intended": 2}
