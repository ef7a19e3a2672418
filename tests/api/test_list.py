"""GET /api/tasks/: tenant scoping, keyset pagination, filters (state, task type, stuck)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from tasks.models import Task
from tests.api.conftest import TASKS, control_body, cursor, no_raise, post_json, url
from tests.conftest import api_client_for, make_task, make_user

pytestmark = pytest.mark.django_db


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


def test_a_nul_character_in_a_list_filter_is_a_400(operator):
    assert no_raise(api_client_for(operator)).get(TASKS, {"tenant": "a\x00"}).status_code == 400


def test_the_api_filters_stuck_tasks_and_refuses_a_bad_value(operator, acme):
    stuck, fresh = make_task(acme), make_task(acme)
    Task.objects.filter(pk=stuck.pk).update(state_entered_at=timezone.now() - timedelta(minutes=30))
    client = api_client_for(operator)
    ids = {row["id"] for row in client.get(TASKS, {"stuck": "true"}).json()["results"]}
    assert ids == {str(stuck.id)}
    ids = {row["id"] for row in client.get(TASKS, {"stuck": "false"}).json()["results"]}
    assert ids == {str(fresh.id)}
    assert client.get(TASKS, {"stuck": "maybe"}).status_code == 400
