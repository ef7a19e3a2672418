"""Where people land: approvers on their inbox, auditors on the audit log, everyone else on the queue,
also when a bookmark of the console (``/?next=/console/``) sent them to log in."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def landing_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.get("/console/start/")["Location"]


def test_each_persona_lands_on_its_own_page(approver, auditor, operator, integrator):
    assert landing_of(approver) == "/console/approvals/"
    assert landing_of(auditor) == "/console/audit/"
    assert landing_of(operator) == "/console/"
    assert landing_of(integrator) == "/console/"


@pytest.mark.parametrize("asked", ["/console/", "/"])
def test_a_login_sent_from_the_console_root_lands_by_role(auditor, asked):
    client = Client()
    auditor.set_password("a long pass phrase")
    auditor.save()
    response = client.post(
        f"/accounts/login/?next={asked}",
        {"username": auditor.get_username(), "password": "a long pass phrase", "next": asked},
    )
    assert response.status_code == 302 and response["Location"] == "/console/start/"
    assert client.get(response["Location"])["Location"] == "/console/audit/"


def test_a_login_sent_from_a_particular_page_goes_back_to_it(auditor):
    client = Client()
    auditor.set_password("a long pass phrase")
    auditor.save()
    response = client.post(
        "/accounts/login/",
        {"username": auditor.get_username(), "password": "a long pass phrase", "next": "/console/bulk/"},
    )
    assert response["Location"] == "/console/bulk/"
