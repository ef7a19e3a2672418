"""Console pages (server-rendered): scoping, filters, guarded controls."""

from __future__ import annotations

import pytest
from django.test import Client

from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_queue_needs_a_login(client):
    response = client.get("/console/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_queue_lists_only_the_users_tenants(operator, outsider, acme, globex):
    mine = make_task(acme, objective="Refund for acme")
    theirs = make_task(globex, objective="Refund for globex")
    page = client_for(operator).get("/console/").content.decode()
    assert str(mine.id) in page and str(theirs.id) not in page


def test_the_queue_filters_by_state(operator, acme):
    waiting = make_task(acme, objective="Parked one")
    advance(waiting.id, 1, State.QUARANTINED, actor=Actor.system("t"), reason_code="quarantine")
    make_task(acme, objective="Ready one")
    page = client_for(operator).get("/console/", {"state": "quarantined"}).content.decode()
    assert "Parked one" in page and "Ready one" not in page


def test_another_tenants_task_page_is_404(outsider, acme):
    task = make_task(acme)
    assert client_for(outsider).get(f"/console/tasks/{task.id}/").status_code == 404


def test_the_task_page_shows_the_timeline_and_the_controls_the_table_allows(operator, acme):
    task = make_task(acme)
    page = client_for(operator).get(f"/console/tasks/{task.id}/").content.decode()
    assert "start" in page and 'value="cancel"' in page and 'value="release"' not in page


def test_an_auditor_sees_no_controls(auditor, acme):
    task = make_task(acme)
    page = client_for(auditor).get(f"/console/tasks/{task.id}/").content.decode()
    assert 'value="cancel"' not in page
    assert (
        client_for(auditor)
        .post(f"/console/tasks/{task.id}/cancel/", {"expected_version": 1, "reason": "x"})
        .status_code
        == 403
    )


def test_a_control_from_a_stale_page_shows_a_conflict_and_changes_nothing(operator, acme):
    task = make_task(acme)
    advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress())
    response = client_for(operator).post(
        f"/console/tasks/{task.id}/cancel/", {"expected_version": 1, "reason": "customer asked"}, follow=True
    )
    assert "changed since you opened it" in response.content.decode()
    assert Task.objects.get(pk=task.pk).state == State.READY


def test_a_control_needs_a_reason(operator, acme):
    task = make_task(acme)
    response = client_for(operator).post(
        f"/console/tasks/{task.id}/cancel/", {"expected_version": 1}, follow=True
    )
    assert "A reason is required" in response.content.decode()
    assert Task.objects.get(pk=task.pk).state == State.READY


def test_cancel_from_the_console_is_applied_and_audited(operator, acme):
    task = make_task(acme)
    response = client_for(operator).post(
        f"/console/tasks/{task.id}/cancel/",
        {"expected_version": 1, "reason": "customer asked", "scope": "task", "confirm": "on"},
        follow=True,
    )
    assert "Cancel applied" in response.content.decode()
    stored = Task.objects.get(pk=task.pk)
    assert stored.state == State.CANCEL_REQUESTED
    event = stored.events.get(state_version=2)
    assert (event.actor_id, event.reason, event.reason_code) == (
        "user:acme-operator",
        "customer asked",
        "cancel:task",
    )


def test_the_queue_tells_active_ready_tasks_from_eligible_ones(operator, acme):
    from tasks import leases

    held = make_task(acme, objective="Being worked on")
    make_task(acme, objective="Nobody on it")
    leases.claim(held.id, worker_id="w1", region="default")
    page = client_for(operator).get("/console/").content.decode()
    rows = {line for line in page.split("<tr>") if "Being worked on" in line or "Nobody on it" in line}
    assert any("Being worked on" in row and "active" in row for row in rows)
    assert any("Nobody on it" in row and "eligible" in row for row in rows)


def test_the_task_page_lists_its_side_effects_and_approvals(operator, acme):
    from ledger.models import Action
    from tasks.transitions import ActionIntent

    task = make_task(
        acme, task_type="pay_invoice", objective="Pay", input={"invoice_id": "I-9", "amount": "9.00"}
    )
    advance(
        task.id,
        1,
        State.READY,
        actor=Actor.worker("w"),
        progress=progress("pay"),
        actions=[ActionIntent(step="pay", connector="payments", effect={"amount": "9.00"})],
    )
    page = client_for(operator).get(f"/console/tasks/{task.id}/").content.decode()
    action = Action.objects.get(task=task)
    assert "Side effects" in page and "payments" in page and "intended" in page
    assert action.idempotency_key[:20] in page
    assert "Approvals" in page
