"""A fresh production database gets its first tenant, its people and an integrator's token from three
documented commands (``create_tenant``, ``grant_role``, ``drf_create_token``), with no admin or shell."""

from __future__ import annotations

import io
import re

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from tenancy.models import AccessEvent, Membership, Tenant


def run(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.mark.django_db
def test_first_tenant_people_and_token_from_the_commands_alone():
    assert run("create_tenant", "acme", "--name", "Acme Corp")[0].startswith("Created tenant acme")
    assert run("create_tenant", "acme")[0].startswith("Exists: tenant acme")  # a deploy script may repeat it
    _, said = run("grant_role", "acme-bot", "acme", "integrator", "--create-user")
    assert "changepassword acme-bot" in said
    run("grant_role", "ann", "acme", "approver", "--create-user")
    run("grant_role", "ann", "acme", "approver")  # idempotent
    ann = get_user_model().objects.get(username="ann")
    assert not ann.has_usable_password()
    assert Membership.objects.filter(user=ann, role="approver").count() == 1
    assert AccessEvent.objects.filter(kind=AccessEvent.Kind.ROLE_GRANTED).count() == 2

    printed, _ = run("drf_create_token", "acme-bot", "--scopes", "read,integrate")
    key = re.match(r"Generated token (\S+) for user acme-bot", printed).group(1)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    started = api.post(
        "/api/tasks/",
        {"task_type": "order_lookup", "objective": "Where is my order?", "input": {"order_id": "A-1"}},
        format="json",
    )
    assert started.status_code == 201, started.content
    assert started.json()["tenant"] == "acme"

    assert run("grant_role", "ann", "acme", "approver", "--revoke")[0].startswith("Revoked ann approver")
    assert not Membership.objects.filter(user=ann).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create_tenant", "not a slug"), "is not a slug"),
        (("grant_role", "ann", "nowhere", "approver"), "no tenant 'nowhere'"),
        (("grant_role", "ann", "acme", "approver"), "no user 'ann'"),
        (("grant_role", "ann", "acme", "superuser", "--create-user"), "unknown role 'superuser'"),
    ],
)
def test_mistakes_are_refused_with_what_to_do(args, message):
    Tenant.objects.create(slug="acme", name="Acme")
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not get_user_model().objects.exists()  # nothing half made
