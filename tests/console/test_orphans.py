"""The orphan effects page: what recover recorded after a restore, per tenant, read-only."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import OrphanEffect, OrphanStatus

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
