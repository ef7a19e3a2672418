"""The audit search by actor: its page's ids come from ``event_tenant_created`` alone (the index carries
the actor), and every page, walked through its cursors, is the page the straightforward query gives:
a common actor, a rare one, a part of one, in any case, one nobody is, with a time window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from audit import selectors
from audit.models import TransitionEvent
from reads import audit_search
from tasks.models import Task
from tasks.states import State

pytestmark = pytest.mark.django_db

ACTORS = ["worker:w0", "worker:w1", "user:ann", "user:ann-2", "system:sweep"]


@pytest.fixture
def events(acme, globex):
    """3,000 events in two tenants: workers most, ``user:ann`` one in 100 (``user:ann-2`` contains it),
    many on the same microsecond (ties broken by id); analyzed, as a big table would be."""
    now = timezone.now()
    tasks = Task.objects.bulk_create(
        Task(tenant=(acme, globex)[n % 2], task_type="refund_request", objective=f"Refund {n}", input={},
             state=State.COMPLETED, policy_version="p1", created_at=now, updated_at=now, state_entered_at=now)
        for n in range(1500)
    )  # fmt: skip
    TransitionEvent.objects.bulk_create(
        TransitionEvent(
            task=task, tenant_id=task.tenant_id, state_version=version, from_state="", to_state="ready",
            trigger="start", actor_kind="worker",
            actor_id="user:ann" if n % 100 == 0 else "user:ann-2" if n % 250 == 1 else ACTORS[n % 2],
            reason="r", attempt=0, policy_version="p1", created_at=now - timedelta(seconds=n % 700),
            prev_hash="", hash=f"{n:032x}{version:032x}",
        )
        for n, task in enumerate(tasks)
        for version in (1, 2)
    )  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE audit_transitionevent")
    return now


def straightforward(tenant_ids, term: str, since=None) -> list[int]:
    rows = TransitionEvent.objects.filter(tenant_id__in=tenant_ids, actor_id__icontains=term)
    if since is not None:
        rows = rows.filter(created_at__gte=since)
    return list(rows.order_by("-created_at", "-id").values_list("id", flat=True))


@pytest.mark.parametrize("term", ["worker:w1", "user:ann", "USER:ANN", "ann-", "er:", "nobody", "%", "_"])
@pytest.mark.parametrize("merged", [True, False])
def test_every_page_by_actor_is_the_straightforward_query_s(acme, globex, events, term, merged):
    for tenant_ids in ([acme.pk], [acme.pk, globex.pk]):
        for since in (None, events - timedelta(seconds=300)):
            criteria = selectors.EventSearch(actor=term, since=since)
            search = audit_search.search if merged else selectors.search_events
            found, before = [], None
            while True:
                page = search(tenant_ids, criteria, before=before, limit=40)
                found += [event.id for event in page.events]
                assert len(page.events) <= 40
                if page.next_cursor is None:
                    break
                before = page.next_cursor
            assert found == straightforward(tenant_ids, term, since)


def test_a_page_by_actor_carries_what_the_list_shows(acme, events):
    page = selectors.search_events([acme.pk], selectors.EventSearch(actor="user:ann"), before=None, limit=5)
    event = page.events[0]
    assert event.actor_id.startswith("user:ann") and event.tenant == acme
    assert event.task_type == "refund_request" and event.task_objective.startswith("Refund ")


def test_a_common_actor_s_page_is_picked_on_the_index_alone(acme, events):
    """No heap row is fetched to be dropped: the walk past other actors' events is an index-only scan."""
    criteria = selectors.EventSearch(actor="worker:w1")
    with CaptureQueriesContext(connection) as queries:
        selectors.search_events([acme.pk], criteria, before=None, limit=50)
    assert len(queries.captured_queries) == 1
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {queries.captured_queries[0]['sql']}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "Index Only Scan using event_tenant_created" in plan, plan
