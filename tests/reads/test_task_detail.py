"""One task-detail read for the API and the console, at a fixed number of queries however big the task.

The big task has 10,000 events (a valid hash chain: ``audit.verify`` accepts it), 1,000 children and
100 actions, all bulk-inserted; the small one is just started. Reading, rendering the API detail and
rendering the console page cost the same number of queries for both.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from api.serializers import API_SECTIONS
from audit import canonical
from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS
from audit.keys import chain_link
from audit.models import TransitionEvent
from audit.verify import verify_task
from console.task_page import SECTIONS as CONSOLE_SECTIONS
from ledger.models import Action
from reads.task_detail import read_task_detail
from tasks.models import Task
from tasks.states import ActorKind, State, Trigger
from tests.conftest import api_client_for, make_task

pytestmark = pytest.mark.django_db

EVENTS, CHILDREN, ACTIONS = 10_000, 1_000, 100


def _grow(task: Task) -> Task:
    """Give ``task`` (just started) ``EVENTS`` events, ``CHILDREN`` children and ``ACTIONS`` actions."""
    first = TransitionEvent.objects.get(task=task, state_version=1)
    prev, start = first.hash, first.created_at
    events = []
    for version in range(2, EVENTS + 1):
        event = TransitionEvent(
            task_id=task.id,
            tenant_id=task.tenant_id,
            state_version=version,
            from_state=State.READY,
            to_state=State.READY,
            trigger=Trigger.STEP,
            actor_kind=ActorKind.WORKER,
            actor_id="worker:w",
            reason=f"step {version}",
            attempt=0,
            policy_version=first.policy_version,
            parent_id=None,
            trace_id="",
            created_at=start + timedelta(milliseconds=version),
        )
        fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
        event.key_id, event.hash = chain_link(prev, fields)
        event.prev_hash, prev = prev, event.hash
        events.append(event)
    TransitionEvent.objects.bulk_create(events, batch_size=2000)
    Task.objects.filter(pk=task.pk).update(state_version=EVENTS, audit_head=prev)
    now = timezone.now()
    Task.objects.bulk_create(
        Task(
            tenant_id=task.tenant_id,
            task_type="order_lookup",
            objective=f"child {n}",
            input={},
            parent=task,
            policy_version=task.policy_version,
            created_at=now,
            updated_at=now,
            state_entered_at=now,
        )
        for n in range(CHILDREN)
    )
    Action.objects.bulk_create(
        Action(
            task=task,
            step="refund",
            idempotency_key=f"{task.id}:refund:{n}",
            connector="payments",
            effect={"amount": n},
            effect_digest=canonical.digest_text(str(n)),
            created_at=now,
            updated_at=now,
        )
        for n in range(ACTIONS)
    )
    return Task.objects.select_related("tenant", "owner").get(pk=task.pk)


@pytest.fixture
def small(acme):
    return Task.objects.select_related("tenant", "owner").get(pk=make_task(acme).pk)


@pytest.fixture
def big(acme):
    task = _grow(make_task(acme, objective="Refund order A-2"))
    assert verify_task(task) is None  # as real as history written by advance()
    return task


def _queries(call) -> int:
    with CaptureQueriesContext(connection) as captured:
        call()
    return len(captured)


def test_reading_a_big_task_costs_what_a_small_one_does(small, big, operator, django_assert_num_queries):
    read = lambda task, sections: read_task_detail(task, user=operator, sections=sections)  # noqa: E731
    _queries(lambda: read(small, API_SECTIONS))  # the user's roles are read once per request, then kept
    with django_assert_num_queries(6):  # lease, takeovers, ledger, children, cancel requests, reruns
        detail = read(big, API_SECTIONS)
    assert len(detail.children) == CHILDREN and detail.actions == () and detail.approvals == ()
    with django_assert_num_queries(8):  # and the page's approvals and actions
        shown = read(big, CONSOLE_SECTIONS)
    assert [c.id for c in shown.children] == [c.id for c in detail.children][:100]
    assert len(shown.actions) == ACTIONS and detail.ledger == shown.ledger == {"intended": ACTIONS}
    assert _queries(lambda: read(small, CONSOLE_SECTIONS)) == 8


def test_the_api_detail_of_a_big_task_costs_what_a_small_one_does(small, big, operator):
    client = api_client_for(operator)
    client.get(f"/api/tasks/{small.id}/")  # what the first request of a process reads once
    sizes = {}
    for name, task in (("small", small), ("big", big)):
        with CaptureQueriesContext(connection) as captured:
            response = client.get(f"/api/tasks/{task.id}/")
        assert response.status_code == 200
        sizes[name] = len(captured)
        children = response.json()["children"]
    assert len(children) == CHILDREN  # the API lists every child
    assert sizes["big"] == sizes["small"] <= 12, sizes


def test_the_task_page_of_a_big_task_costs_what_a_small_one_does(small, big, operator):
    client = Client()
    client.force_login(operator)
    client.get(f"/console/tasks/{small.id}/")  # what the first request of a process reads once
    sizes = {}
    for name, task in (("small", small), ("big", big)):
        with CaptureQueriesContext(connection) as captured:
            response = client.get(f"/console/tasks/{task.id}/")
        assert response.status_code == 200
        sizes[name] = len(captured)
    page = response.content.decode()
    assert (
        len(re.findall(r'<li value="\d+" class="event">', page)) == 50
        and "The first 100 are shown; the API lists them all." in page
    )
    # The big one adds its timeline's "next page" link probe at most; nothing grows with the rows.
    assert sizes["big"] <= sizes["small"] + 1 and sizes["big"] <= 25, sizes
