"""A user of two tenants: the queue and the audit search read one tenant at a time and merge.

What users rely on: every page, walked to the end through its "next" links, lists exactly the rows in
exactly the order that one query over both tenants gives (ties on the time broken by id across
tenants, page boundaries included), for every sort and filter; the exports stream the same rows as the
straightforward query; a tenant the user does not hold answers empty without reading a task.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from uuid import UUID

import pytest
from django.db import connection
from django.http import QueryDict
from django.test import Client, RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit import selectors as audit_selectors
from audit.models import TransitionEvent
from console import queue as queue_parts
from reads import audit_search
from tasks.models import Task
from tasks.states import State
from tenancy.models import Role, Tenant
from tenancy.services import grant_role
from tests.conftest import make_user

pytestmark = pytest.mark.django_db

STATES = [State.READY, State.COMPLETED, State.FAILED, State.CANCELED, State.COMPLETED]
QUEUE_FILTERS = [
    {},
    {"sort": "age"},
    {"state": "completed", "sort": "age"},
    {"state": ["ready", "failed"]},
    {"q": "order"},
    {"q": "order 1"},
    {"reason": "step_error"},
    {"escalated": "true"},
    {"tenant": "globex"},
    {"tenant": "globex", "sort": "age"},
]


@pytest.fixture
def both(acme, globex):
    """An operator and auditor of both tenants, and tasks interleaved between them."""
    user = make_user("both", acme, Role.OPERATOR, Role.AUDITOR)
    for role in (Role.OPERATOR, Role.AUDITOR):
        grant_role(user, globex, role)
    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(
            tenant=(acme, globex)[(n // 3) % 2],
            task_type="refund_request",
            objective=f"Refund order {n}",
            input={"order_id": n},
            state=STATES[n % len(STATES)],
            state_reason="step_error" if n % 4 == 0 else "",
            escalation_level=1 if n % 5 == 0 else 0,
            policy_version="p1",
            created_at=now,
            updated_at=now,
            # Few distinct times: many ties, within and across tenants, broken by id.
            state_entered_at=now - timedelta(minutes=n % 6),
        )
        for n in range(70)
    )
    TransitionEvent.objects.bulk_create(
        TransitionEvent(
            task=task,
            tenant_id=task.tenant_id,
            state_version=version,
            from_state="" if version == 1 else "ready",
            to_state="ready" if version == 1 else task.state,
            trigger="start" if version == 1 else "step",
            actor_kind="system",
            actor_id="user:both" if n % 7 == 0 else f"worker:w{n % 3}",
            reason="moved",
            reason_code="step_error" if n % 4 == 0 else "",
            attempt=0,
            policy_version="p1",
            created_at=now - timedelta(seconds=(n * version) % 9),  # ties again
            prev_hash="",
            hash=f"{n:032x}{version:032x}",
        )
        for n, task in enumerate(tasks)
        for version in (1, 2)
    )
    return user


def request_for(user, params: dict) -> tuple[object, QueryDict]:
    query = QueryDict(mutable=True)
    for key, value in params.items():
        query.setlist(key, value if isinstance(value, list) else [value])
    request = RequestFactory().get("/console/", query)
    request.user = user
    return request, query


def walk(user, params: dict, *, merged: bool, size: int = 7) -> list[list[UUID]]:
    """Every page of the queue, following its next links: merged per tenant, or one query over all."""
    request, query = request_for(user, params)
    pages = []
    while True:
        _, tasks, tenants = queue_parts.filtered(request, query)
        page = queue_parts.page(tasks, query, size=size, tenants=tenants if merged else ())
        pages.append([task.id for task in page.tasks])
        if not page.next_query:
            return pages
        query = QueryDict(page.next_query)


@pytest.mark.parametrize("params", QUEUE_FILTERS, ids=lambda p: "&".join(f"{k}={v}" for k, v in p.items()))
def test_every_queue_page_merged_per_tenant_is_the_page_one_query_gives(both, params):
    merged, straight = walk(both, params, merged=True), walk(both, params, merged=False)
    assert merged == straight
    assert sum(map(len, merged)) > 7  # more than one page: the boundaries were crossed
    # and that is every matching task once, in the order the sort names
    _, query = request_for(both, params)
    _, tasks, _ = queue_parts.filtered(request_for(both, params)[0], query)
    order = ("state_entered_at", "id") if params.get("sort") == "age" else ("-id",)
    assert [task_id for page in merged for task_id in page] == list(
        tasks.order_by(*order).values_list("id", flat=True)
    )


def test_a_page_of_a_two_tenant_queue_is_one_query_a_tenant(both):
    request, query = request_for(both, {"sort": "age"})
    _, tasks, tenants = queue_parts.filtered(request, query)
    with CaptureQueriesContext(connection) as queries:
        queue_parts.page(tasks, query, size=7, tenants=tenants)
    assert len(tenants) == 2 and len(queries) == 2
    assert all('"tasks_task"."tenant_id" = ' in q["sql"] for q in queries)


def test_a_tenant_the_user_does_not_hold_answers_empty_without_reading_a_task(both):
    Tenant.objects.create(slug="initech", name="Initech")
    for slug in ("initech", "nobody-has-this"):
        request, query = request_for(both, {"tenant": slug})
        with CaptureQueriesContext(connection) as queries:
            _, tasks, tenants = queue_parts.filtered(request, query)
            page = queue_parts.page(tasks, query, size=7, tenants=tenants)
        assert tenants == [] and list(page.tasks) == []
        assert not any("tasks_task" in q["sql"] for q in queries)


def test_the_queue_export_of_two_tenants_lists_every_task_newest_first(both, monkeypatch):
    monkeypatch.setattr(queue_parts, "EXPORT_CHUNK", 4)  # many chunks per tenant
    client = Client()
    client.force_login(both)
    response = client.get("/console/export.csv")
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    ids = [UUID(row[0]) for row in rows[1:]]
    assert ids == list(Task.objects.order_by("-id").values_list("id", flat=True))


AUDIT_SEARCHES = [
    audit_selectors.EventSearch(),
    audit_selectors.EventSearch(actor="user:both"),
    audit_selectors.EventSearch(to_state="completed"),
    audit_selectors.EventSearch(reason="step_error"),
    audit_selectors.EventSearch(trigger="start"),
]


def audit_pages(tenant_ids, criteria, *, merged: bool, limit: int = 6) -> list[list[int]]:
    search = audit_search.search if merged else audit_selectors.search_events
    pages, before = [], None
    while True:
        page = search(tenant_ids, criteria, before=before, limit=limit)
        pages.append([event.id for event in page.events])
        if page.next_cursor is None:
            return pages
        before = page.next_cursor


@pytest.mark.parametrize("criteria", AUDIT_SEARCHES, ids=lambda c: str(c.as_dict()) or "all")
def test_every_audit_search_page_merged_per_tenant_is_the_page_one_query_gives(both, acme, globex, criteria):
    tenants = [acme.pk, globex.pk]
    merged = audit_pages(tenants, criteria, merged=True)
    assert merged == audit_pages(tenants, criteria, merged=False)
    assert len(merged) > 1
    streamed = [event.id for event in audit_search.iter_events(tenants, criteria)]
    assert streamed == [event.id for event in audit_selectors.iter_search(tenants, criteria)]
    assert streamed == [event_id for page in merged for event_id in page]


def test_the_audit_export_of_two_tenants_streams_the_straightforward_rows(both, acme, globex, monkeypatch):
    monkeypatch.setattr(audit_selectors, "EXPORT_PAGE", 5)
    monkeypatch.setattr(audit_search, "EXPORT_PAGE", 5)
    client = Client()
    client.force_login(both)
    response = client.get("/console/audit/export.csv", {"actor": "worker:"})
    text = b"".join(response.streaming_content).decode()
    rows = list(csv.DictReader(io.StringIO(text)))
    expected = list(
        TransitionEvent.objects.filter(actor_id__icontains="worker:").order_by("-created_at", "-id")
    )
    assert [row["hash"] for row in rows] == [event.hash for event in expected]
