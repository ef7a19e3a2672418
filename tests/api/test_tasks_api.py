"""The task API over HTTP: tenancy, idempotent creation, validation, the list,
detail and history, operator controls, and hostile request bodies.

Every request goes through DRF's ``APIClient`` (``api_client_for``) on PostgreSQL.
"""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import TransitionEvent
from tasks.checkpoints import CURRENT_SCHEMA
from tasks.models import ExternalEvent, Task
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.models import Membership, Role
from tests.conftest import REFUND_INPUT, api_client_for, make_task, make_user, progress

pytestmark = pytest.mark.django_db

TASKS = "/api/tasks/"
HISTORY = ("events", "checkpoints", "actions")


def url(task: Task, suffix: str = "") -> str:
    return f"{TASKS}{task.id}/" + (f"{suffix}/" if suffix else "")


def post_json(client, path: str, body: Any):
    return client.post(path, json.dumps(body), content_type="application/json")


def post_raw(client, path: str, raw: bytes | str, content_type: str = "application/json"):
    return client.post(path, raw, content_type=content_type)


def create_body(**overrides) -> dict[str, Any]:
    body = {"task_type": "refund_request", "objective": "Refund order A-1", "input": dict(REFUND_INPUT)}
    body.update(overrides)
    return body


def control_body(version: int = 1, **overrides) -> dict[str, Any]:
    return {"expected_version": version, "reason": "customer asked", **overrides}


def no_raise(client):
    """Let a server error come back as a 500 response instead of an exception in the test."""
    client.raise_request_exception = False
    return client


def cursor(querystring: str) -> str:
    """A cursor DRF can decode (base64 of a query string) carrying any position."""
    return base64.b64encode(querystring.encode()).decode()


def in_waiting_retry(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.WAITING_RETRY,
        actor=Actor.worker("w1"),
        trigger=Trigger.ATTEMPT_FAILED,
        wait_deadline=timezone.now() + timedelta(hours=1),
    )


# --- tenant isolation and authentication -------------------------------------------------------


def test_another_tenants_task_detail_answers_404(outsider, acme):
    task = make_task(acme)
    assert api_client_for(outsider).get(url(task)).status_code == 404


@pytest.mark.parametrize("history", HISTORY)
def test_another_tenants_task_history_answers_404(outsider, acme, history):
    task = make_task(acme)
    assert api_client_for(outsider).get(url(task, history)).status_code == 404


@pytest.mark.parametrize("control", ["cancel", "escalate", "quarantine"])
def test_a_control_on_another_tenants_task_answers_404_and_changes_nothing(outsider, acme, control):
    task = make_task(acme)
    response = post_json(api_client_for(outsider), url(task, control), control_body())
    assert response.status_code == 404
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, stored.escalation_level) == (State.READY, 1, 0)


def test_an_unknown_task_id_answers_404(operator):
    assert api_client_for(operator).get(f"{TASKS}01a226dd-8447-778e-99ab-449890608930/").status_code == 404


def test_the_list_never_shows_another_tenants_tasks(operator, outsider, acme, globex):
    mine = make_task(acme)
    theirs = make_task(globex)
    listed = {row["id"] for row in api_client_for(operator).get(TASKS).json()["results"]}
    assert listed == {str(mine.id)}
    listed = {row["id"] for row in api_client_for(outsider).get(TASKS).json()["results"]}
    assert listed == {str(theirs.id)}


def test_filtering_the_list_by_another_tenant_shows_nothing(operator, acme, globex):
    make_task(globex)
    assert api_client_for(operator).get(TASKS, {"tenant": "globex"}).json()["results"] == []


def test_a_user_without_any_tenant_sees_an_empty_list(acme):
    loner = make_user("loner")
    make_task(acme)
    assert api_client_for(loner).get(TASKS).json()["results"] == []


def test_an_unauthenticated_list_answers_401_with_a_token_challenge(acme):
    response = api_client_for(None).get(TASKS)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Token"


def test_an_unauthenticated_detail_answers_401(acme):
    task = make_task(acme)
    assert api_client_for(None).get(url(task)).status_code == 401


def test_an_unauthenticated_create_answers_401_and_creates_nothing(acme):
    assert post_json(api_client_for(None), TASKS, create_body()).status_code == 401
    assert not Task.objects.exists()


def test_an_unauthenticated_control_answers_401(acme):
    task = make_task(acme)
    assert post_json(api_client_for(None), url(task, "cancel"), control_body()).status_code == 401
    assert Task.objects.get(pk=task.pk).state_version == 1


# --- idempotent create ---------------------------------------------------------------------------


def test_create_starts_a_ready_task_owned_by_the_caller(operator):
    response = post_json(api_client_for(operator), TASKS, create_body())
    assert response.status_code == 201
    body = response.json()
    assert (body["state"], body["state_version"], body["tenant"], body["owner"]) == (
        "ready",
        1,
        "acme",
        "acme-operator",
    )
    assert body["input"] == {**REFUND_INPUT, "reason": ""}  # as the task type accepted it
    assert Task.objects.get(pk=body["id"]).owner == operator


def test_an_admin_may_create_a_task(admin_user):
    assert post_json(api_client_for(admin_user), TASKS, create_body()).status_code == 201


def test_the_same_idempotency_key_twice_returns_the_first_task(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    second = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Task.objects.filter(idempotency_key="order-A-1").count() == 1
    assert TransitionEvent.objects.filter(task_id=first.json()["id"]).count() == 1


def test_the_same_idempotency_key_with_a_different_body_is_a_409_conflict(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body(idempotency_key="order-A-1"))
    other = create_body(idempotency_key="order-A-1", input={**REFUND_INPUT, "amount": "99.00"})
    response = post_json(client, TASKS, other)
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_conflict"
    assert response.json()["task"] == first.json()["id"]
    assert Task.objects.count() == 1


def test_the_same_idempotency_key_in_two_tenants_starts_two_tasks(operator, outsider):
    mine = post_json(api_client_for(operator), TASKS, create_body(idempotency_key="shared"))
    theirs = post_json(api_client_for(outsider), TASKS, create_body(idempotency_key="shared"))
    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]
    assert (mine.json()["tenant"], theirs.json()["tenant"]) == ("acme", "globex")
    assert Task.objects.filter(idempotency_key="shared").count() == 2


def test_creates_without_an_idempotency_key_start_separate_tasks(operator):
    client = api_client_for(operator)
    first = post_json(client, TASKS, create_body())
    second = post_json(client, TASKS, create_body())
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["id"] != second.json()["id"]


# --- create validation -----------------------------------------------------------------------------


def test_an_unknown_task_type_is_a_400_on_task_type(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(task_type="launch_rockets"))
    assert response.status_code == 400
    assert "task_type" in response.json()
    assert not Task.objects.exists()


def test_a_missing_objective_is_a_400_on_objective(operator):
    body = create_body()
    del body["objective"]
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "objective" in response.json()


@pytest.mark.parametrize(
    "value", [[], ["a"], "text", 7, None], ids=["empty-list", "list", "string", "int", "null"]
)
def test_an_input_that_is_not_an_object_is_a_400_on_input(operator, value):
    response = post_json(api_client_for(operator), TASKS, create_body(input=value))
    assert response.status_code == 400
    assert "input" in response.json()
    assert not Task.objects.exists()


@pytest.mark.parametrize("amount", ["-5.00", "0", "abc", "1.234", "1" * 20, True])
def test_an_amount_the_task_type_refuses_is_a_400_on_input_amount(operator, amount):
    body = create_body(input={**REFUND_INPUT, "amount": amount})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "amount" in response.json()["input"]


@pytest.mark.parametrize("email", ["not-an-email", "", "a b@example.com", 42])
def test_a_bad_customer_email_is_a_400_on_input_customer_email(operator, email):
    body = create_body(input={**REFUND_INPUT, "customer_email": email})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "customer_email" in response.json()["input"]


def test_an_input_field_the_task_type_does_not_know_is_a_400(operator):
    body = create_body(input={**REFUND_INPUT, "discount": "100%"})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "discount" in response.json()["input"]


def test_a_missing_required_input_field_is_a_400_naming_it(operator):
    body = create_body(input={k: v for k, v in REFUND_INPUT.items() if k != "order_id"})
    response = post_json(api_client_for(operator), TASKS, body)
    assert response.status_code == 400
    assert "order_id" in response.json()["input"]


def test_an_unparseable_deadline_is_a_400_on_deadline(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(deadline="next tuesday"))
    assert response.status_code == 400
    assert "deadline" in response.json()


def test_an_auditor_may_not_create_a_task(auditor):
    assert post_json(api_client_for(auditor), TASKS, create_body()).status_code == 403
    assert not Task.objects.exists()


def test_an_approver_may_not_create_a_task(approver):
    assert post_json(api_client_for(approver), TASKS, create_body()).status_code == 403
    assert not Task.objects.exists()


def test_a_user_in_no_tenant_may_not_create_a_task(db):
    loner = make_user("loner")
    assert post_json(api_client_for(loner), TASKS, create_body()).status_code == 403


@pytest.fixture
def two_tenant_operator(acme, globex):
    user = make_user("roaming-operator", acme, Role.OPERATOR)
    Membership.objects.create(user=user, tenant=globex, role=Role.OPERATOR)
    return user


def test_an_operator_in_two_tenants_must_name_the_tenant(two_tenant_operator):
    response = post_json(api_client_for(two_tenant_operator), TASKS, create_body())
    assert response.status_code == 400
    assert "tenant" in response.json()
    assert not Task.objects.exists()


def test_an_operator_in_two_tenants_creates_in_the_tenant_named(two_tenant_operator):
    response = post_json(api_client_for(two_tenant_operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 201
    assert response.json()["tenant"] == "globex"
    assert Task.objects.get().tenant.slug == "globex"


def test_naming_a_tenant_the_caller_is_not_in_is_a_400(operator, globex):
    response = post_json(api_client_for(operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 400
    assert "tenant" in response.json()


def test_naming_a_tenant_where_the_caller_only_audits_is_a_403(operator, globex):
    Membership.objects.create(user=operator, tenant=globex, role=Role.AUDITOR)
    response = post_json(api_client_for(operator), TASKS, create_body(tenant="globex"))
    assert response.status_code == 403


def test_an_operator_with_the_longest_allowed_username_can_create_a_task(acme):
    # Django allows 150-character usernames; the audit actor id is "user:<username>".
    long_named = make_user("o" * 150, acme, Role.OPERATOR)
    response = no_raise(api_client_for(long_named)).post(
        TASKS, json.dumps(create_body()), content_type="application/json"
    )
    assert response.status_code == 201


# --- list ------------------------------------------------------------------------------------------


def test_the_list_pages_by_keyset_newest_first_with_every_task_once(operator, acme):
    created = []
    for n in range(7):
        created.append(str(make_task(acme, objective=f"task {n}").id))
        time.sleep(0.002)  # ids are millisecond-ordered UUIDv7s
    client = api_client_for(operator)
    seen, sizes = [], []
    page = client.get(TASKS, {"page_size": 3}).json()
    while True:
        sizes.append(len(page["results"]))
        seen += [row["id"] for row in page["results"]]
        if not page["next"]:
            break
        page = client.get(page["next"]).json()
    assert sizes == [3, 3, 1]
    assert seen == list(reversed(created))


def test_a_later_page_links_back_to_the_previous_one(operator, acme):
    for _ in range(4):
        make_task(acme)
    client = api_client_for(operator)
    first = client.get(TASKS, {"page_size": 2}).json()
    second = client.get(first["next"]).json()
    assert first["previous"] is None
    back = client.get(second["previous"]).json()
    assert [row["id"] for row in back["results"]] == [row["id"] for row in first["results"]]


def test_the_list_filters_by_state(operator, acme):
    canceled = make_task(acme)
    make_task(acme)
    post_json(api_client_for(operator), url(canceled, "cancel"), control_body())
    rows = api_client_for(operator).get(TASKS, {"state": "cancel_requested"}).json()["results"]
    assert [row["id"] for row in rows] == [str(canceled.id)]


def test_the_list_filters_by_several_states_at_once(operator, acme):
    canceled = make_task(acme)
    ready = make_task(acme)
    post_json(api_client_for(operator), url(canceled, "cancel"), control_body())
    rows = api_client_for(operator).get(TASKS + "?state=cancel_requested&state=ready").json()["results"]
    assert {row["id"] for row in rows} == {str(canceled.id), str(ready.id)}


def test_the_list_filters_by_task_type(operator, acme):
    lookup = make_task(acme, task_type="order_lookup", input={"order_id": "A-1"})
    make_task(acme)
    rows = api_client_for(operator).get(TASKS, {"task_type": "order_lookup"}).json()["results"]
    assert [row["id"] for row in rows] == [str(lookup.id)]


def test_an_unknown_state_filter_is_a_400(operator):
    response = api_client_for(operator).get(TASKS, {"state": "sleeping"})
    assert response.status_code == 400
    assert "state" in response.json()


def test_an_unknown_task_type_filter_is_a_400(operator):
    response = api_client_for(operator).get(TASKS, {"task_type": "launch_rockets"})
    assert response.status_code == 400
    assert "task_type" in response.json()


def test_a_cursor_that_is_not_base64_is_a_400(operator):
    response = api_client_for(operator).get(TASKS, {"cursor": "not a cursor!"})
    assert response.status_code == 400
    assert "cursor" in response.json()


def test_a_well_formed_cursor_with_a_position_that_is_not_a_task_id_is_a_400(operator, acme):
    make_task(acme)
    response = no_raise(api_client_for(operator)).get(TASKS, {"cursor": cursor("p=not-a-uuid")})
    assert response.status_code == 400


def test_a_well_formed_history_cursor_with_a_position_that_is_not_a_version_is_a_400(operator, acme):
    task = make_task(acme)
    response = no_raise(api_client_for(operator)).get(url(task, "events"), {"cursor": cursor("p=abc")})
    assert response.status_code == 400


# --- detail ----------------------------------------------------------------------------------------


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


# --- events, checkpoints, actions ------------------------------------------------------------------


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
    from audit.chain import GENESIS, event_hash

    task = make_task(acme)  # its creation event covers the first checkpoint's digest
    events = api_client_for(auditor).get(url(task, "events")).json()["results"]
    prev = GENESIS
    for event in sorted(events, key=lambda e: e["state_version"]):
        fields = {**event, "task_id": task.id, "tenant_id": acme.id}
        fields["created_at"] = datetime.fromisoformat(event["created_at"])
        assert event["checkpoint_digest"]
        assert (event["prev_hash"], event_hash(prev, fields)) == (prev, event["hash"])
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


# --- operator controls -----------------------------------------------------------------------------


def test_cancel_at_the_current_version_is_applied(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(1))
    assert response.status_code == 200
    body = response.json()
    assert body["applied"] is True
    assert (body["task"]["state"], body["task"]["state_version"]) == ("cancel_requested", 2)
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (State.CANCEL_REQUESTED, 2)


def test_cancel_records_its_scope_in_the_reason_code(operator, acme):
    task = make_task(acme)
    post_json(api_client_for(operator), url(task, "cancel"), control_body(1, scope="children"))
    assert TransitionEvent.objects.get(task=task, state_version=2).reason_code == "cancel:children"


def test_a_repeated_cancel_answers_200_without_applying_anything(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "cancel"), control_body(1))
    response = post_json(client, url(task, "cancel"), control_body(1))
    assert response.status_code == 200
    assert response.json()["applied"] is False
    assert response.json()["task"]["state_version"] == 2
    assert TransitionEvent.objects.filter(task=task).count() == 2


def test_a_stale_expected_version_is_a_409_with_the_current_state(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "escalate"), control_body(1))
    response = post_json(client, url(task, "cancel"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "stale_version"
    assert (response.json()["state"], response.json()["state_version"]) == ("ready", 2)
    assert Task.objects.get(pk=task.pk).state == State.READY


def test_an_expected_version_from_the_future_is_a_409_stale_version(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(9))
    assert response.status_code == 409
    assert response.json()["code"] == "stale_version"
    assert response.json()["state_version"] == 1


def test_release_on_a_ready_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "release"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "transition_not_allowed"
    assert (response.json()["state"], response.json()["state_version"]) == ("ready", 1)


def test_retry_on_a_ready_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "retry"), control_body(1))
    assert response.status_code == 409
    assert response.json()["code"] == "transition_not_allowed"


def test_a_control_on_a_terminal_task_is_a_409_transition_not_allowed(operator, acme):
    task = make_task(acme)
    advance(task.id, 1, State.COMPLETED, actor=Actor.worker("w1"), trigger=Trigger.COMPLETE)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(2))
    assert response.status_code == 409
    assert (response.json()["code"], response.json()["state"]) == ("transition_not_allowed", "completed")


def test_a_control_without_a_reason_is_a_400_on_reason(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), {"expected_version": 1})
    assert response.status_code == 400
    assert "reason" in response.json()
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_control_without_an_expected_version_is_a_400(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), {"reason": "why not"})
    assert response.status_code == 400
    assert "expected_version" in response.json()


def test_an_unknown_cancel_scope_is_a_400_on_scope(operator, acme):
    task = make_task(acme)
    response = post_json(api_client_for(operator), url(task, "cancel"), control_body(1, scope="universe"))
    assert response.status_code == 400
    assert "scope" in response.json()


@pytest.mark.parametrize("control", ["cancel", "escalate", "quarantine"])
def test_an_auditor_may_not_use_a_control(auditor, acme, control):
    task = make_task(acme)
    assert post_json(api_client_for(auditor), url(task, control), control_body(1)).status_code == 403
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_an_approver_may_not_cancel(approver, acme):
    task = make_task(acme)
    assert post_json(api_client_for(approver), url(task, "cancel"), control_body(1)).status_code == 403


def test_an_admin_may_cancel(admin_user, acme):
    task = make_task(acme)
    response = post_json(api_client_for(admin_user), url(task, "cancel"), control_body(1))
    assert (response.status_code, response.json()["applied"]) == (200, True)


def test_escalate_bumps_the_escalation_level_and_keeps_the_state(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    response = post_json(client, url(task, "escalate"), control_body(1, escalate_to="approver"))
    assert response.status_code == 200
    detail = response.json()["task"]
    assert (detail["state"], detail["state_version"], detail["escalation_level"]) == ("ready", 2, 1)
    assert detail["escalation"] == {"level": 1, "to": "approver", "reason": "customer asked"}
    second = post_json(client, url(task, "escalate"), control_body(2))
    assert second.json()["task"]["escalation"]["level"] == 2


def test_quarantine_then_release_sends_the_task_to_resume_validation(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    quarantined = post_json(client, url(task, "quarantine"), control_body(1)).json()["task"]
    assert quarantined["state"] == "quarantined"
    response = post_json(client, url(task, "release"), control_body(2))
    assert response.status_code == 200
    released = response.json()["task"]
    assert (released["state"], released["state_version"]) == ("resume_validation", 3)


def test_a_repeated_quarantine_answers_200_without_applying_anything(operator, acme):
    task = make_task(acme)
    client = api_client_for(operator)
    post_json(client, url(task, "quarantine"), control_body(1))
    response = post_json(client, url(task, "quarantine"), control_body(1))
    assert (response.status_code, response.json()["applied"]) == (200, False)


def test_retry_on_a_waiting_retry_task_sends_it_to_resume_validation(operator, acme):
    task = in_waiting_retry(make_task(acme))
    response = post_json(api_client_for(operator), url(task, "retry"), control_body(task.state_version))
    assert response.status_code == 200
    assert response.json()["task"]["state"] == "resume_validation"


# --- hostile bodies --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [b'{"task_type": ', b"{'task_type': 'refund_request'}", b"", b"\xff\xfe\x00", b'{"a": NaN}', b"[1, 2,]"],
    ids=["truncated", "single-quotes", "empty", "not-utf8", "nan", "trailing-comma"],
)
def test_a_malformed_json_body_is_a_400(operator, raw):
    response = post_raw(api_client_for(operator), TASKS, raw)
    assert response.status_code == 400
    assert not Task.objects.exists()


def test_a_malformed_json_control_body_is_a_400(operator, acme):
    task = make_task(acme)
    response = post_raw(api_client_for(operator), url(task, "cancel"), b'{"expected_version": ')
    assert response.status_code == 400


@pytest.mark.parametrize("content_type", ["text/plain", "application/xml", "application/octet-stream"])
def test_a_body_that_is_not_json_is_a_415(operator, content_type):
    response = post_raw(api_client_for(operator), TASKS, json.dumps(create_body()), content_type)
    assert response.status_code == 415
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "overrides",
    [
        {"objective": "refund\x00now"},
        {"idempotency_key": "key\x00"},
        {"input": {**REFUND_INPUT, "order_id": "A\x001"}},
        {"input": {**REFUND_INPUT, "reason": "x\x00"}},
        {"input": {**REFUND_INPUT, "bad\x00key": "x"}},
        {"tenant": "ac\x00me"},
    ],
    ids=["objective", "idempotency-key", "input-value", "input-optional-value", "input-key", "tenant"],
)
def test_nul_characters_in_create_strings_are_a_400(operator, overrides):
    response = post_json(no_raise(api_client_for(operator)), TASKS, create_body(**overrides))
    assert response.status_code == 400
    assert not Task.objects.exists()


def test_nul_characters_in_a_control_reason_are_a_400(operator, acme):
    task = make_task(acme)
    client = no_raise(api_client_for(operator))
    response = post_json(client, url(task, "cancel"), control_body(1, reason="a\x00b"))
    assert response.status_code == 400
    assert "reason" in response.json()


def test_a_nul_character_in_a_list_filter_is_a_400(operator):
    assert no_raise(api_client_for(operator)).get(TASKS, {"tenant": "a\x00"}).status_code == 400


@pytest.mark.parametrize(
    "raw",
    [
        '{"task_type": "refund_request", "objective": "\\ud800", "input": {}}',
        '{"task_type": "refund_request", "objective": "x", "input": {"order_id": "\\udfff"}}',
    ],
    ids=["objective", "input"],
)
def test_lone_surrogates_in_create_strings_are_a_400(operator, raw):
    assert post_raw(no_raise(api_client_for(operator)), TASKS, raw).status_code == 400


@pytest.mark.parametrize(
    "raw_version",
    ["2147483648", "9" * 40, "1" + "0" * 5000, "-1", "0", "1.5", "1e400", "true", '"x"', "null"],
    ids=["int32+1", "huge", "5001-digits", "negative", "zero", "fraction", "inf", "bool", "str", "null"],
)
def test_an_out_of_range_expected_version_is_a_400(operator, acme, raw_version):
    task = make_task(acme)
    raw = f'{{"expected_version": {raw_version}, "reason": "r"}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "cancel"), raw)
    assert response.status_code == 400
    assert Task.objects.get(pk=task.pk).state_version == 1


def test_a_huge_amount_is_a_400_on_input_amount(operator):
    body = create_body(input={**REFUND_INPUT, "amount": 10**60})
    response = post_json(no_raise(api_client_for(operator)), TASKS, body)
    assert response.status_code == 400
    assert "amount" in response.json()["input"]


def test_an_oversized_objective_is_a_400(operator):
    response = post_json(api_client_for(operator), TASKS, create_body(objective="x" * 5001))
    assert response.status_code == 400
    assert "objective" in response.json()


def test_a_deeply_nested_input_within_the_parsers_reach_is_a_400(operator):
    nested: Any = 1
    for _ in range(300):
        nested = {"a": nested}
    body = create_body(input={**REFUND_INPUT, "extra": nested})
    assert post_json(no_raise(api_client_for(operator)), TASKS, body).status_code == 400


@pytest.mark.parametrize("raw", ["[" * 50000, '{"a":' * 5000], ids=["arrays", "objects"])
def test_a_deeply_nested_create_body_is_a_4xx_not_a_500(operator, raw):
    response = post_raw(no_raise(api_client_for(operator)), TASKS, raw)
    assert 400 <= response.status_code < 500
    assert not Task.objects.exists()


def test_a_deeply_nested_control_body_is_a_4xx_not_a_500(operator, acme):
    task = make_task(acme)
    response = post_raw(no_raise(api_client_for(operator)), url(task, "cancel"), "[" * 50000)
    assert 400 <= response.status_code < 500
    assert Task.objects.get(pk=task.pk).state_version == 1


@pytest.mark.parametrize(
    "body", [[], [1, 2], "text", 3, None, True], ids=["list", "list2", "str", "int", "null", "bool"]
)
def test_a_json_body_that_is_not_an_object_is_a_400(operator, body):
    assert post_json(api_client_for(operator), TASKS, body).status_code == 400


# --- values PostgreSQL cannot hold, in input and external events ------------------------------
# A NUL or a lone surrogate anywhere in a body (value or key) is a 400 naming
# where it sits, and nothing is stored: before, a lone surrogate reached the database as a 500.


def waiting_for_input(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.WAITING_INPUT,
        actor=Actor.worker("w1"),
        trigger=Trigger.REQUEST_INPUT,
        progress=progress("ask_customer"),
        wait_deadline=timezone.now() + timedelta(days=1),
    )


POISONED_EVENTS = {
    "nul-value": ('{"event_key": "k", "event_type": "t", "payload": {"a": "x\\u0000"}}', "payload.a"),
    "surrogate-value": ('{"event_key": "k", "event_type": "t", "payload": {"a": "\\ud800"}}', "payload.a"),
    "nul-key": ('{"event_key": "k", "event_type": "t", "payload": {"a\\u0000": 1}}', "payload"),
    "surrogate-key": ('{"event_key": "k", "event_type": "t", "payload": {"\\udfff": 1}}', "payload"),
    "nested": (
        '{"event_key": "k", "event_type": "t", "payload": {"items": [{"sku": "\\ud800"}]}}',
        "payload.items[0].sku",
    ),
}


@pytest.mark.parametrize(("raw", "where"), POISONED_EVENTS.values(), ids=POISONED_EVENTS.keys())
def test_an_external_event_with_an_unstorable_payload_is_a_400_naming_where(operator, acme, raw, where):
    task = make_task(acme)
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 400
    [message] = response.json()["payload"]
    assert message.startswith(f"{where} ")
    assert not ExternalEvent.objects.filter(task=task).exists()


@pytest.mark.parametrize("key", ["k\\u0000", "k\\ud800"], ids=["nul", "surrogate"])
def test_an_event_key_that_cannot_be_stored_is_a_400_on_event_key(operator, acme, key):
    task = make_task(acme)
    raw = f'{{"event_key": "{key}", "event_type": "t", "payload": {{}}}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "external-events"), raw)
    assert response.status_code == 400
    assert "event_key" in response.json()
    assert not ExternalEvent.objects.filter(task=task).exists()


POISONED_ANSWERS = {
    "nul": ('{"answer": "mug\\u0000"}', "payload.answer"),
    "surrogate": ('{"answer": "\\ud800"}', "payload.answer"),
    "surrogate-key": ('{"answer": "mug", "\\ud800": 1}', "payload"),
}


@pytest.mark.parametrize(("payload", "where"), POISONED_ANSWERS.values(), ids=POISONED_ANSWERS.keys())
def test_an_input_answer_that_cannot_be_stored_is_a_400_naming_where(operator, acme, payload, where):
    task = waiting_for_input(make_task(acme))
    raw = f'{{"expected_version": {task.state_version}, "payload": {payload}}}'
    response = post_raw(no_raise(api_client_for(operator)), url(task, "input"), raw)
    assert response.status_code == 400
    [message] = response.json()["payload"]
    assert message.startswith(f"{where} ")
    assert Task.objects.get(pk=task.pk).state == State.WAITING_INPUT


def test_a_surrogate_in_create_input_keys_is_a_400_on_input(operator):
    raw = json.dumps(create_body()).replace('"order_id"', '"\\ud800": 1, "order_id"', 1)
    response = post_raw(no_raise(api_client_for(operator)), TASKS, raw)
    assert response.status_code == 400
    assert response.json()["input"] == [
        "input has a key '\\ud800' that contains a lone surrogate U+D800 (at position 0)"
    ]
    assert not Task.objects.exists()
