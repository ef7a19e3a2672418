"""GET /api/tasks/<id>/events|checkpoints|actions/: a task's history, readable by auditors."""

from __future__ import annotations

from datetime import datetime

import pytest

from tasks.checkpoints import CURRENT_SCHEMA
from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tests.api.conftest import HISTORY, control_body, cursor, no_raise, post_json, url
from tests.conftest import api_client_for, make_task, progress

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("history", HISTORY)
def test_another_tenants_task_history_answers_404(outsider, acme, history):
    task = make_task(acme)
    assert api_client_for(outsider).get(url(task, history)).status_code == 404


def test_the_events_of_a_new_task_hold_its_creation(operator, acme):
    task = make_task(acme)
    events = api_client_for(operator).get(url(task, "events")).json()["results"]
    assert len(events) == 1
    created = events[0]
    assert (created["state_version"], created["from_state"], created["to_state"], created["trigger"]) == (
        1,
        "",
        "ready",
        "start",
    )
    assert created["hash"] and created["prev_hash"]


def test_an_auditor_can_recompute_every_hash_of_the_chain_from_the_events_api(auditor, acme):
    from audit.chain import GENESIS, link_hash
    from audit.keys import chain_keys

    task = make_task(acme)  # its creation event covers the first checkpoint's digest
    events = api_client_for(auditor).get(url(task, "events")).json()["results"]
    prev = GENESIS
    for event in sorted(events, key=lambda e: e["state_version"]):
        fields = {**event, "task_id": task.id, "tenant_id": acme.id}
        fields["created_at"] = datetime.fromisoformat(event["created_at"])
        assert event["checkpoint_digest"]
        link = link_hash(prev, fields, key_id=event["key_id"], keys=chain_keys())
        assert (event["prev_hash"], link) == (prev, event["hash"])
        prev = event["hash"]


def test_the_events_list_a_control_after_the_creation(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "cancel"), control_body())
    events = client.get(url(task, "events")).json()["results"]
    assert [(e["state_version"], e["trigger"]) for e in events] == [(1, "start"), (2, "cancel")]
    assert events[1]["actor_id"] == "user:acme-operator"
    assert events[1]["reason"] == "customer asked"


def test_the_first_checkpoint_is_readable_with_its_document(operator, acme):
    task = make_task(acme)
    rows = api_client_for(operator).get(url(task, "checkpoints")).json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["state_version"], row["schema_version"], row["codec"]) == (1, CURRENT_SCHEMA, "json/v1")
    assert row["readable"] is True
    document = row["document"]
    assert (document["task_id"], document["state"], document["state_version"]) == (str(task.id), "ready", 1)
    assert document["step"] == "gather_evidence"
    assert document["policy_version"] == task.policy_version


def test_the_actions_list_shows_ledger_rows(operator, acme):
    task = make_task(acme)
    advance(
        task.id,
        1,
        State.READY,
        actor=Actor.worker("w1"),
        progress=progress(),
        actions=[ActionIntent("refund", "payments", {"amount": "10.00"})],
    )
    rows = api_client_for(operator).get(url(task, "actions")).json()["results"]
    assert len(rows) == 1
    row = rows[0]
    assert (row["step"], row["connector"], row["dispatch_state"]) == ("refund", "payments", "intended")
    assert rows[0]["idempotency_key"].startswith(f"{task.id}:refund:")


def test_an_auditor_may_read_a_tasks_history(auditor, acme):
    task = make_task(acme)
    client = api_client_for(auditor)
    assert all(client.get(url(task, history)).status_code == 200 for history in HISTORY)


def test_a_well_formed_history_cursor_with_a_position_that_is_not_a_version_is_a_400(operator, acme):
    task = make_task(acme)
    response = no_raise(api_client_for(operator)).get(url(task, "events"), {"cursor": cursor("p=abc")})
    assert response.status_code == 400
