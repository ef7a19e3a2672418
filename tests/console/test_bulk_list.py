"""Past bulk operations: who sees which, newest first, keyset paged, each linking to its report."""

from __future__ import annotations

import pytest
from django.test import Client

from console import bulk as console_bulk
from runtime import bulk
from tasks.models import Task
from tests.conftest import make_task, make_user

pytestmark = pytest.mark.django_db


def start(user, tenant, reason: str):
    task = make_task(tenant, objective=f"Target of {reason}")
    return bulk.bulk_create(
        user=user, control="cancel", reason=reason, tasks=Task.objects.filter(pk=task.pk), selection={}
    )


def page_of(user, query: str = "") -> str:
    client = Client()
    client.force_login(user)
    response = client.get(f"/console/bulk/{query}")
    assert response.status_code == 200
    return response.content.decode()


def test_each_user_sees_their_own_and_what_they_may_audit(
    acme, globex, operator, auditor, approver, outsider
):
    mine = start(operator, acme, "acme cleanup")
    theirs = start(outsider, globex, "globex cleanup")
    # An operation that touched both tenants: only readable by who audits both (or its creator).
    both_task = [make_task(acme), make_task(globex)]
    both = bulk.bulk_create(
        user=outsider, control="cancel", reason="both tenants",
        tasks=Task.objects.filter(pk__in=[t.pk for t in both_task]), selection={},
    )  # fmt: skip

    assert f"/console/bulk/{mine.id}/" in page_of(operator)
    assert f"/console/bulk/{theirs.id}/" not in page_of(operator)
    assert f"/console/bulk/{both.id}/" not in page_of(operator)
    # The auditor of acme reads acme's operations, not globex's nor the mixed one.
    auditor_page = page_of(auditor)
    assert f"/console/bulk/{mine.id}/" in auditor_page
    assert f"/console/bulk/{both.id}/" not in auditor_page
    # Approvers hold no audit role: nothing but their own.
    assert "No bulk operations" in page_of(approver)
    outsider_page = page_of(outsider)
    assert f"/console/bulk/{theirs.id}/" in outsider_page and f"/console/bulk/{both.id}/" in outsider_page
    assert f"/console/bulk/{mine.id}/" not in outsider_page
    # Every listed link opens (the list and the report apply the same rule).
    for user in (operator, auditor, outsider):
        client = Client()
        client.force_login(user)
        for operation in console_bulk.visible_operations(user):
            assert client.get(f"/console/bulk/{operation.id}/").status_code == 200


def test_status_and_counts_are_shown(acme, operator):
    operation = start(operator, acme, "shown")
    bulk.bulk_run(operation.id, runner="test")
    page = page_of(operator)
    assert "Done" in page and "1 of 1" in page and "shown" in page


def test_newest_first_and_keyset_paged(acme, operator, monkeypatch):
    monkeypatch.setattr(console_bulk, "LIST_PAGE", 3)
    operations = [start(operator, acme, f"op {n}") for n in range(5)]
    first = page_of(operator)
    positions = [first.find(f"/console/bulk/{op.id}/") for op in reversed(operations[2:])]
    assert all(p > 0 for p in positions) and positions == sorted(positions)
    assert f"/console/bulk/{operations[1].id}/" not in first
    assert f'href="?before={operations[2].id}" rel="next"' in first
    second = page_of(operator, f"?before={operations[2].id}")
    assert f"/console/bulk/{operations[1].id}/" in second and f"/console/bulk/{operations[0].id}/" in second
    assert 'rel="next"' not in second
    # A mangled cursor is the first page.
    assert f"/console/bulk/{operations[4].id}/" in page_of(operator, "?before=nonsense")


def test_a_user_without_memberships_sees_an_empty_list(db):
    loner = make_user("loner")
    assert "No bulk operations" in page_of(loner)
