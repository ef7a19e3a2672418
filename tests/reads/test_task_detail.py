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
from audit import canonical, sealing
from audit.chain import HASHED_FIELDS, OPTIONAL_HASHED_FIELDS
from audit.keys import chain_link
from audit.models import TransitionEvent
from audit.verify import verify_task
from console.task_page import SECTIONS as CONSOLE_SECTIONS
from ledger.models import Action
from reads.task_detail import read_task_detail
from runtime.models import AgentTurn, ModelUsage
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
    # The big one adds its timeline's "next page" link probe at most; nothing grows with the rows. (The
    # chain's integrity badge, checked from the remembered verified-through mark, is part of the 30.)
    assert sizes["big"] <= sizes["small"] + 1 and sizes["big"] <= 30, sizes


def _agent_task(tenant, turns: int) -> Task:
    """A support_agent task whose run took ``turns`` turns, each asking to refund (an action each, the
    first also asked an approval) with its usage row: rows as ``runtime.sdk.step`` writes them."""
    task = make_task(
        tenant,
        task_type="support_agent",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": "5"},
    )
    now = timezone.now()
    rows, usages, actions = [], [], []
    for n in range(1, turns + 1):
        call = f"call_{n}_refund_order"
        items = [{"type": "function_call", "name": "refund_order", "call_id": call, "arguments": "{}"}]
        at = sealing.task_place(task.id, "agent_turns", "agent", n)
        rows.append(
            AgentTurn(
                task=task,
                step="agent",
                turn=n,
                agent="support",
                model_id="scripted-support-v1",
                response=sealing.seal({"items": items, "usage": {}}, at),
                state_version=2 * n,
                recorded_at=now,
            )
        )
        usages.append(
            ModelUsage(
                task=task,
                step="agent",
                state_version=2 * n,
                attempt=0,
                model_id="scripted-support-v1",
                input_tokens=n,
                output_tokens=1,
                cost=None,
                committed=True,
                recorded_at=now,
            )
        )
        actions.append(
            Action(
                task=task,
                step=f"refund_order#{call}",
                idempotency_key=f"{task.id}:refund:{call}",
                connector="payments",
                effect={"n": n},
                effect_digest=canonical.digest_text(call),
                created_at=now,
                updated_at=now,
            )
        )
    AgentTurn.objects.bulk_create(rows)
    ModelUsage.objects.bulk_create(usages)
    Action.objects.bulk_create(actions)
    return Task.objects.select_related("tenant", "owner").get(pk=task.pk)


def test_an_agent_tasks_turns_cost_four_queries_however_many_turns(acme, operator):
    read = lambda task: read_task_detail(task, user=operator, sections=CONSOLE_SECTIONS)  # noqa: E731
    plain = Task.objects.select_related("tenant", "owner").get(pk=make_task(acme).pk)
    read(plain)  # the user's roles are read once per request, then kept
    assert _queries(lambda: read(plain)) == 8  # a type without an agent reads no turns at all
    unstarted = _agent_task(acme, 0)
    assert _queries(lambda: read(unstarted)) == 9  # the turns, none yet: nothing else is asked
    few, many = _agent_task(acme, 3), _agent_task(acme, 80)
    assert _queries(lambda: read(few)) == _queries(lambda: read(many)) == 12

    shown = read(many).agent_turns
    assert len(shown.turns) == 50 and shown.more  # the page's cap
    third = read(few).agent_turns.turns[2]
    assert (third.turn, third.input_tokens, third.output_tokens, third.cost) == (3, 3, 1, None)
    assert [(c.tool, c.call_id, c.fate) for c in third.calls] == [
        ("refund_order", "call_3_refund_order", "intended: not sent yet")
    ]
    assert read_task_detail(few, user=operator, sections=API_SECTIONS).agent_turns.turns == ()
