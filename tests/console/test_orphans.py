"""The orphan effects page: what recover recorded after a restore, per tenant, read-only, and its
link in the navigation for those it answers."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.utils import timezone

from ledger import restores
from ledger.models import OrphanEffect, OrphanStatus, RestoreRecord

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def orphan(tenant, key: str, **fields) -> OrphanEffect:
    now = timezone.now()
    return OrphanEffect.objects.create(
        connector="payments",
        idempotency_key=key,
        tenant=tenant,
        found_at=now,
        system_created_at=now,
        system_status="succeeded",
        record_id="17",
        **fields,
    )


def test_an_operator_sees_the_open_orphans_of_their_tenant_only(operator, acme, globex):
    orphan(acme, "k2.1.mine:pay:0")
    orphan(globex, "k2.2.theirs:pay:0")
    orphan(None, "no-tenant:pay:0")
    page = client_for(operator).get("/console/orphans/").content.decode()
    assert "k2.1.mine:pay:0" in page
    assert "k2.2.theirs:pay:0" not in page and "no-tenant:pay:0" not in page


def test_a_settled_orphan_links_the_task_that_settled_it(operator, acme):
    task_id = uuid.uuid4()
    orphan(
        acme, "k2.1.done:pay:0", status=OrphanStatus.SETTLED, settled_task=task_id, settled_at=timezone.now()
    )
    page = client_for(operator).get("/console/orphans/").content.decode()
    assert "No open orphan effect" in page and f"/console/tasks/{task_id}/" in page


def test_an_approver_is_refused(approver):
    assert client_for(approver).get("/console/orphans/").status_code == 403


def restore_record(tenant, **fields) -> RestoreRecord:
    """A restore record as ``recover --apply`` writes it (chained and signed)."""
    now = timezone.now()
    record = RestoreRecord(tenant=tenant, at=now, since=now, restored_to=now, orphans=3, recorded=3, **fields)
    [saved] = restores.append([(record, [])])
    return saved


def test_the_page_lists_the_restores_recorded_for_the_users_tenants(operator, acme, globex):
    restore_record(acme, anchor="anchor-20261201T090000000000Z.jsonl", tasks_lost=0)
    restore_record(globex, anchor="anchor-of-globex.jsonl")
    page = client_for(operator).get("/console/orphans/").content.decode()
    assert "Restores recorded" in page and "anchor-20261201T090000000000Z.jsonl" in page
    assert "anchor-of-globex.jsonl" not in page


def test_without_a_restore_the_page_says_none_was_recorded(operator, acme):
    assert (
        "No restore recorded in your tenants."
        in client_for(operator).get("/console/orphans/").content.decode()
    )


@pytest.mark.parametrize("who", ["operator", "auditor", "admin_user"])
def test_the_nav_links_the_orphans_page_for_those_who_read_it(who, request, acme):
    page = client_for(request.getfixturevalue(who)).get("/console/").content.decode()
    assert 'href="/console/orphans/"' in page


def test_the_nav_hides_the_orphans_link_from_an_approver(approver):
    page = client_for(approver).get("/console/approvals/").content.decode()
    assert 'href="/console/orphans/"' not in page
