"""Who reads a large bulk operation before a worker has started it: its creator, and whoever may audit
every tenant it covers (the tenants the confirmation stored beside its snapshot) — the same rule as once
its results exist, and never an auditor of another tenant."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from django.db import connection
from django.test import Client

from console import bulk as console_bulk
from runtime import bulk
from runtime.models import BulkOperation, BulkResult, BulkSnapshot, BulkStatus
from tasks.models import Task
from tenancy.models import Role
from tenancy.services import grant_role
from tests.conftest import make_task, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _runs_in_the_worker(settings, monkeypatch):
    """Every operation here is a large one: confirmed and snapshotted, its results left to a worker."""
    settings.BULK_SYNC_LIMIT = 1
    monkeypatch.setattr(bulk, "ring", lambda operation_id: None)


@pytest.fixture
def globex_auditor(globex):
    return make_user("globex-auditor", globex, Role.AUDITOR)


@pytest.fixture
def both_auditor(acme, globex):
    user = make_user("both-auditor", acme, Role.AUDITOR)
    grant_role(user, globex, Role.AUDITOR)
    return user


def confirm(user, tasks: list[Task], reason: str) -> BulkOperation:
    operation = bulk.bulk_create(
        user=user,
        control="escalate",
        escalate_to="admin",
        reason=reason,
        tasks=Task.objects.filter(pk__in=[task.pk for task in tasks]),
        selection={},
    )
    assert operation.status == BulkStatus.QUEUED
    assert not BulkResult.objects.filter(operation=operation).exists()  # nothing written but the snapshot
    return operation


def report_status(user, operation: BulkOperation) -> int:
    client = Client()
    client.force_login(user)
    return client.get(f"/console/bulk/{operation.id}/").status_code


def listed(user, operation: BulkOperation) -> bool:
    client = Client()
    client.force_login(user)
    response = client.get("/console/bulk/")
    assert response.status_code == 200
    return f"/console/bulk/{operation.id}/" in response.content.decode()


def run(operation: BulkOperation) -> None:
    bulk.bulk_run(operation.id, runner="test-worker")
    operation.refresh_from_db()
    assert operation.status == BulkStatus.DONE
    assert not BulkSnapshot.objects.filter(operation=operation).exists()


def test_the_confirmation_stores_the_distinct_tenants_beside_the_snapshot(acme, globex, operator):
    tasks = [make_task(acme), make_task(acme), make_task(globex), make_task(acme)]
    operation = confirm(operator, tasks, "mixed")
    snapshot = BulkSnapshot.objects.get(operation=operation)
    assert sorted(snapshot.tenant_ids) == sorted([acme.id, globex.id])
    assert len(snapshot.body) == 4


def test_a_non_creator_auditor_reads_a_not_yet_started_operation_and_after_the_worker_ran(
    acme, operator, auditor, globex_auditor
):
    operation = confirm(operator, [make_task(acme) for _ in range(3)], "acme backlog")
    # Before any worker: the auditor of acme opens the report and finds it in the list.
    assert report_status(auditor, operation) == 200
    assert listed(auditor, operation)
    # The auditor of another tenant learns nothing of it.
    assert report_status(globex_auditor, operation) == 404
    assert not listed(globex_auditor, operation)

    run(operation)
    assert report_status(auditor, operation) == 200 and listed(auditor, operation)
    assert report_status(globex_auditor, operation) == 404 and not listed(globex_auditor, operation)


def test_an_auditor_of_one_tenant_never_sees_an_operation_touching_only_another(
    acme, globex, outsider, auditor, globex_auditor
):
    """The attack: acme's auditor reaching a globex-only operation, by its id or in the list."""
    operation = confirm(outsider, [make_task(globex) for _ in range(2)], "globex secret")
    assert report_status(auditor, operation) == 404
    assert not listed(auditor, operation)
    assert report_status(globex_auditor, operation) == 200 and listed(globex_auditor, operation)

    run(operation)
    assert report_status(auditor, operation) == 404
    assert not listed(auditor, operation)
    assert report_status(globex_auditor, operation) == 200 and listed(globex_auditor, operation)


def test_a_multi_tenant_operation_is_read_only_by_who_audits_every_tenant_it_touches(
    acme, globex, auditor, globex_auditor, both_auditor
):
    creator = make_user("both-operator", acme, Role.OPERATOR)
    grant_role(creator, globex, Role.OPERATOR)
    operation = confirm(creator, [make_task(acme), make_task(globex)], "both tenants")
    for stage in ("confirmed", "run"):
        if stage == "run":
            run(operation)
        assert report_status(creator, operation) == 200 and listed(creator, operation), stage
        assert report_status(both_auditor, operation) == 200 and listed(both_auditor, operation), stage
        for one_tenant in (auditor, globex_auditor):
            assert report_status(one_tenant, operation) == 404, stage
            assert not listed(one_tenant, operation), stage


def test_every_listed_waiting_operation_opens_and_no_other_does(acme, globex, operator, outsider, auditor):
    """The list and the report apply one rule, before the worker as after."""
    mine = confirm(operator, [make_task(acme), make_task(acme)], "acme")
    theirs = confirm(outsider, [make_task(globex), make_task(globex)], "globex")
    client = Client()
    client.force_login(auditor)
    visible = {operation.id for operation in console_bulk.visible_operations(auditor)}
    assert visible == {mine.id}
    for operation in (mine, theirs):
        expected = 200 if operation.id in visible else 404
        assert client.get(f"/console/bulk/{operation.id}/").status_code == expected


def test_the_migration_fills_the_tenants_of_snapshots_already_waiting(acme, globex, operator):
    operation = confirm(operator, [make_task(acme), make_task(globex), make_task(globex)], "older")
    BulkSnapshot.objects.filter(operation=operation).update(tenant_ids=[])  # as the column was added
    assert report_status(make_user("acme-auditor-2", acme, Role.AUDITOR), operation) == 404
    migration = importlib.import_module("runtime.migrations.0013_bulk_snapshot_tenant_ids")
    with connection.cursor() as cursor:  # the migration's own statement, as its schema editor runs it
        migration.fill(None, SimpleNamespace(connection=connection, execute=cursor.execute))
    assert sorted(BulkSnapshot.objects.get(operation=operation).tenant_ids) == sorted([acme.id, globex.id])
