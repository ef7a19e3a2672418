"""The decide permission at scale: direct (foreign-key) guardian grants, one query per read."""

from __future__ import annotations

import importlib

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from guardian.models import GroupObjectPermission
from guardian.shortcuts import assign_perm, remove_perm

from approvals import selectors
from approvals.models import ApprovalRequest, ApprovalRequestGroupPermission
from approvals.services import DECIDE
from tenancy.models import Membership, Role
from tenancy.services import role_group
from tests.approvals.conftest import APPROVALS, fresh
from tests.conftest import api_client_for, make_user
from tests.console.test_approvals import many_pending

pytestmark = pytest.mark.django_db


def queries(call) -> int:
    with CaptureQueriesContext(connection) as captured:
        call()
    return len(captured)


def test_grants_live_on_the_direct_table_not_guardians_generic_one(acme, approver):
    (request,) = many_pending(acme, 1)
    assert ApprovalRequestGroupPermission.objects.filter(content_object=request).exists()
    assert not GroupObjectPermission.objects.exists()
    assert fresh(approver).has_perm(DECIDE, request)


def test_the_inbox_query_never_casts_ids_to_text(acme, approver):
    sql = str(selectors.inbox(fresh(approver)).query).lower()
    assert "object_pk" not in sql and "::text" not in sql and "cast(" not in sql


def test_reads_cost_the_same_number_of_queries_at_10_and_at_300_pending(acme, approver):
    counts = []
    for size in (10, 300):
        many_pending(acme, size - ApprovalRequest.objects.count())
        user = fresh(approver)
        client = api_client_for(user)
        counts.append(
            (
                queries(lambda u=user: list(selectors.inbox(u)[:50])),
                queries(lambda u=user: selectors.inbox_page(u)),
                queries(lambda c=client: c.get(APPROVALS, {"status": "pending"})),
            )
        )
    assert counts[0] == counts[1], counts


def test_a_revoked_grant_hides_the_request(acme, approver):
    first, second = many_pending(acme, 2)
    remove_perm(DECIDE, role_group(acme, Role.APPROVER), first)
    user = fresh(approver)
    assert [r.pk for r in selectors.inbox(user)] == [second.pk]
    assert not user.has_perm(DECIDE, first)


def test_a_grant_to_one_user_lets_them_decide_without_the_group(acme):
    first, _ = many_pending(acme, 2)
    person = make_user("person")
    Membership.objects.create(user=person, tenant=acme, role=Role.APPROVER)  # the role, not the group
    assert list(selectors.inbox(fresh(person))) == []
    assign_perm(DECIDE, person, first)
    assert [r.pk for r in selectors.inbox(fresh(person))] == [first.pk]
    assert fresh(person).has_perm(DECIDE, first)


def test_the_migration_moves_generic_grants_to_the_direct_table(acme, approver):
    from django.apps import apps
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    (request,) = many_pending(acme, 1)
    ApprovalRequestGroupPermission.objects.all().delete()
    kind = ContentType.objects.get_for_model(ApprovalRequest)
    GroupObjectPermission.objects.create(
        group=role_group(acme, Role.APPROVER),
        permission=Permission.objects.get(content_type=kind, codename="decide_approvalrequest"),
        content_type=kind,
        object_pk=str(request.pk),
    )
    migration = importlib.import_module("approvals.migrations.0002_direct_object_permissions")
    with connection.schema_editor() as editor:
        migration.forward(apps, editor)
    assert ApprovalRequestGroupPermission.objects.filter(content_object=request).exists()
    assert not GroupObjectPermission.objects.exists()
    assert fresh(approver).has_perm(DECIDE, request)
