"""Every console page reads the database a bounded number of times, whether it shows a few rows or many.

Each page is rendered twice: over a small world and over one with many tasks,
events, approvals and quarantined tasks. Both renders must stay under the
page's ceiling (``django_assert_max_num_queries``), and the big one may not
issue more queries than the small one beyond a fixed slack (a "next page"
link, a badge): a query per row would show up as the difference.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tests.conftest import make_task, make_user, progress

pytestmark = pytest.mark.django_db

# Ceiling per page (session, user, roles, the approvals badge and the page's own reads all count).
CEILING = {  # measured when written, plus a little room: 10, 19, 8, 9, 6, 6, 10, 6
    "queue": 13,
    "task": 32,  # issue 24: + its A2A caller and push deliveries (reads.task_a2a, one query); issue 26:
    # + the integrity badge (task row, verified-through mark, events after it, takeovers, keyed moment,
    # moving the mark) and whether the user may audit (the links to the history and export)
    "approvals": 11,
    "approval": 13,  # issue 20: + earlier decisions, earlier effects, the second factor's device
    "quarantine": 9,
    "audit": 9,
    "audit-task": 17,  # + the badge's anchor window (keyed moment, last anchor) and the takeover chain;
    # issue 26: + the verified-through mark, read and moved
    "bulk-list": 8,
    "task-types": 9,  # 8 measured: the layout's, the caller's roles, the policy versions in force
}
SLACK = 2  # more rows may add a "next page" probe, never a query per row
MANY = 60


def build(acme, owner, rows: int) -> dict[str, str]:
    """``rows`` tasks of each kind, and the path of every page over them."""
    from tests.console.test_approvals import ask

    approvals = [
        ask(make_task(acme, owner=owner, objective=f"Refund {n}")) for n in range(max(rows // 10, 1))
    ]
    for n in range(rows):
        task = make_task(acme, objective=f"Task {n}")
        task = advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress(f"s{n}"))
        if n % 2:
            advance(
                task.id,
                task.state_version,
                State.QUARANTINED,
                actor=Actor.system("t"),
                reason_code="step_error",
            )
    from runtime import bulk

    chief = get_user_model().objects.get(username="acme-chief")
    for n in range(max(rows // 10, 1)):
        target = make_task(acme, objective=f"Bulk target {n}")
        bulk.bulk_create(
            user=owner if n % 2 else chief,
            control="cancel",
            reason=f"count {n}",
            tasks=Task.objects.filter(pk=target.pk),
            selection={},
        )
    task_id = approvals[0].task_id
    return {
        "queue": "/console/",
        "task": f"/console/tasks/{task_id}/",
        "approvals": "/console/approvals/",
        "approval": f"/console/approvals/{approvals[0].id}/",
        "quarantine": "/console/quarantine/",
        "audit": "/console/audit/",
        "audit-task": f"/console/audit/tasks/{task_id}/",
        "bulk-list": "/console/bulk/",
        "task-types": "/console/task-types/",
    }


def count(client: Client, path: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return len(queries)


@pytest.mark.parametrize("page", sorted(CEILING))
def test_a_console_page_issues_a_bounded_number_of_queries(
    page, acme, operator, django_assert_max_num_queries
):
    chief = make_user("acme-chief", acme, Role.ADMIN, Role.APPROVER)
    client = Client()
    client.force_login(chief)

    few = build(acme, operator, rows=1)
    with django_assert_max_num_queries(CEILING[page]):
        few_queries = count(client, few[page])
    many = build(acme, operator, rows=MANY)
    with django_assert_max_num_queries(CEILING[page]):
        many_queries = count(client, many[page])
    assert many_queries <= few_queries + SLACK, (
        f"{page}: {few_queries} queries with few rows, {many_queries} with many"
    )
