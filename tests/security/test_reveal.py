"""Sensitive fields are masked on every surface; revealing one is explicit, permission-checked and recorded.

The task API, its checkpoint and action histories and the console's task page
show a card as ``•••• 1881`` and an address as ``••••``. An operator or an
admin of the task's tenant may reveal one field (API ``POST
/api/tasks/{id}/reveal/``, or the small form beside it on the task page, with
a reason): the answer is the clear value and an access event records who,
which task, field and version, never the value. Auditors and approvers are
refused (403), another tenant's task does not exist (404).
"""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from django.test import Client

from ledger.models import Action
from tasks.models import Task
from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.models import AccessEvent
from tests.api.conftest import post_json, url
from tests.conftest import REFUND_INPUT, api_client_for, make_task, progress

pytestmark = pytest.mark.django_db

CARD, OTHER_CARD = "visa-1881", "mastercard-2222"
EMAIL = REFUND_INPUT["customer_email"]
WORKER = Actor.worker("w")


def with_card(tenant) -> Task:
    """A refund whose checkpoint v2 holds the card, v3 another card, and whose refund is intended."""
    task = make_task(tenant)
    facts = {"order_id": "A-1", "customer_email": EMAIL, "refund_card": CARD}
    task = advance(task.id, 1, State.READY, actor=WORKER, progress=progress("triage", **facts))
    effect = {"kind": "refund", "order_id": "A-1", "amount": "10.00", "currency": "USD", "card": OTHER_CARD}
    return advance(
        task.id,
        2,
        State.READY,
        actor=WORKER,
        progress=progress("pay_refund", **{**facts, "refund_card": OTHER_CARD}),
        actions=[ActionIntent(step="pay_refund", connector="payments", effect=effect)],
    )


def reveals() -> list[str]:
    return list(AccessEvent.objects.filter(kind=AccessEvent.Kind.REVEAL).values_list("detail", flat=True))


# --- masked everywhere -------------------------------------------------------------------------------


def test_the_task_and_its_histories_show_sensitive_fields_masked(acme, auditor):
    task = with_card(acme)
    client = api_client_for(auditor)

    detail = client.get(url(task)).json()
    history = client.get(url(task, "checkpoints")).json()["results"]
    [action] = client.get(url(task, "actions")).json()["results"]

    assert detail["input"]["customer_email"] == "••••" and detail["input"]["order_id"] == "A-1"
    cards = {row["state_version"]: row["document"]["facts"].get("refund_card") for row in history}
    assert cards == {1: None, 2: "•••• 1881", 3: "•••• 2222"}
    assert action["effect"]["card"] == "•••• 2222" and action["effect"]["amount"] == "10.00"
    for body in (detail, history, action):
        assert CARD not in str(body) and OTHER_CARD not in str(body) and EMAIL not in str(body)


def test_the_task_page_shows_them_masked_with_a_reveal_form_for_operators_only(acme, operator, auditor):
    task = with_card(acme)
    as_operator, as_auditor = Client(), Client()
    as_operator.force_login(operator)
    as_auditor.force_login(auditor)

    page = as_operator.get(f"/console/tasks/{task.id}/").content.decode()
    audited = as_auditor.get(f"/console/tasks/{task.id}/").content.decode()

    for html in (page, audited):
        assert OTHER_CARD not in html and EMAIL not in html and "•••• 2222" in html
    assert f'action="/console/tasks/{task.id}/reveal/"' in page
    assert 'name="field" value="refund_card"' in page and 'name="field" value="customer_email"' in page
    assert "/reveal/" not in audited


# --- the API reveal ----------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["operator", "admin_user"])
def test_an_operator_or_admin_reveals_one_field_and_the_reveal_is_recorded(acme, who, request):
    task = with_card(acme)
    client = api_client_for(request.getfixturevalue(who))

    response = post_json(client, url(task, "reveal"), {"field": "refund_card", "reason": "chargeback 77"})

    assert response.status_code == 200, response.content
    assert response.json() == {
        "task": str(task.id),
        "field": "refund_card",
        "value": OTHER_CARD,
        "source": "checkpoint",
        "state_version": 3,
    }
    assert "no-store" in response["Cache-Control"]
    event = AccessEvent.objects.get(kind=AccessEvent.Kind.REVEAL)
    assert event.tenant == acme and event.username.startswith("acme-")
    assert event.detail == f"task={task.id} field=refund_card version=3 reason=chargeback 77"


def test_a_reveal_reads_the_version_asked_for_or_the_tasks_input(acme, operator):
    task = with_card(acme)
    client = api_client_for(operator)

    older = post_json(client, url(task, "reveal"), {"field": "refund_card", "state_version": 2}).json()
    email = post_json(client, url(task, "reveal"), {"field": "customer_email"}).json()

    assert (older["value"], older["state_version"]) == (CARD, 2)
    assert (email["value"], email["source"], email["state_version"]) == (EMAIL, "input", None)
    assert reveals() == [
        f"task={task.id} field=refund_card version=2",
        f"task={task.id} field=customer_email source=input",
    ]


@pytest.mark.parametrize("who", ["auditor", "approver"])
def test_auditors_and_approvers_may_not_reveal(acme, who, request):
    task = with_card(acme)
    response = post_json(
        api_client_for(request.getfixturevalue(who)), url(task, "reveal"), {"field": "refund_card"}
    )
    assert response.status_code == 403
    assert reveals() == []


def test_another_tenants_task_is_not_found(acme, outsider):
    task = with_card(acme)
    response = post_json(api_client_for(outsider), url(task, "reveal"), {"field": "refund_card"})
    assert response.status_code == 404
    assert reveals() == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"field": "order_id"}, 400, "not_sensitive"),  # shown in clear already
        ({"field": "damaged_item"}, 404, "field_not_present"),  # not asked yet
        ({"field": "refund_card", "state_version": 9}, 404, "no_such_checkpoint"),
        ({"field": "refund_card", "state_version": 1}, 404, "field_not_present"),
        ({"field": "refund_card", "state_version": "two"}, 400, None),
        ({}, 400, None),
    ],
)
def test_nothing_to_reveal_is_a_precise_4xx_and_nothing_is_recorded(acme, operator, body, status, code):
    response = post_json(api_client_for(operator), url(with_card(acme), "reveal"), body)
    assert response.status_code == status, response.content
    if code:
        assert response.json()["code"] == code
    assert reveals() == []


def test_a_field_under_a_retired_key_cannot_be_revealed(acme, operator, settings):
    settings.FIELD_ENCRYPTION_KEYS = f"old:{Fernet.generate_key().decode()}"
    task = with_card(acme)
    settings.FIELD_ENCRYPTION_KEYS = f"new:{Fernet.generate_key().decode()}"

    response = post_json(api_client_for(operator), url(task, "reveal"), {"field": "refund_card"})

    assert response.status_code == 409 and response.json()["code"] == "checkpoint_undecryptable"
    assert reveals() == []


def test_the_actions_history_masks_an_effect_whose_key_is_retired(acme, operator, settings):
    settings.FIELD_ENCRYPTION_KEYS = f"old:{Fernet.generate_key().decode()}"
    task = with_card(acme)
    settings.FIELD_ENCRYPTION_KEYS = f"new:{Fernet.generate_key().decode()}"

    [action] = api_client_for(operator).get(url(task, "actions")).json()["results"]

    assert action["effect"]["card"] == "[sealed]"
    assert Action.objects.get(task=task).effect["card"]["$sealed"] == "old"


# --- the console reveal ------------------------------------------------------------------------------


def console(user, **options) -> Client:
    client = Client(**options)
    client.force_login(user)
    return client


def test_an_operator_reveals_from_the_task_page_with_a_reason(acme, operator):
    task = with_card(acme)

    response = console(operator).post(
        f"/console/tasks/{task.id}/reveal/", {"field": "refund_card", "state_version": 2, "reason": "dispute"}
    )

    assert response.status_code == 200
    assert CARD in response.content.decode() and "no-store" in response["Cache-Control"]
    assert reveals() == [f"task={task.id} field=refund_card version=2 reason=dispute"]


def test_a_reveal_without_a_reason_reveals_nothing(acme, operator):
    task = with_card(acme)
    response = console(operator).post(
        f"/console/tasks/{task.id}/reveal/", {"field": "refund_card"}, follow=True
    )
    page = response.content.decode()
    assert "A reason is required to reveal a field" in page and OTHER_CARD not in page
    assert reveals() == []


def test_the_console_reveal_needs_the_csrf_token(acme, operator):
    task = with_card(acme)
    client = console(operator, enforce_csrf_checks=True)
    body = {"field": "refund_card", "reason": "dispute"}
    assert client.post(f"/console/tasks/{task.id}/reveal/", body).status_code == 403
    assert reveals() == []


@pytest.mark.parametrize(("who", "status"), [("auditor", 403), ("approver", 403), ("outsider", 404)])
def test_the_console_reveal_refuses_auditors_approvers_and_other_tenants(acme, who, status, request):
    task = with_card(acme)
    client = console(request.getfixturevalue(who))
    body = {"field": "refund_card", "reason": "curious"}
    assert client.post(f"/console/tasks/{task.id}/reveal/", body).status_code == status
    assert reveals() == []
