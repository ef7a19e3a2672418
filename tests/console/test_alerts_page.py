"""The alerts page and the navigation badge: scoped by tenant, confirmed forms, audited handling."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import alerts
from runtime.models import Alert, AlertNote
from tasks.models import Task
from tests.conftest import make_task

pytestmark = pytest.mark.django_db
PAGE = "/console/alerts/"


def client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def stuck(tenant, objective: str = "Refund order A-1") -> Task:
    """A runnable task nobody has leased for hours: the scan raises ``no_live_lease`` for it."""
    task = make_task(tenant, objective=objective)
    Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - timedelta(hours=3))
    return task


def raised(tenant, objective: str = "Refund order A-1") -> Alert:
    task = stuck(tenant, objective)
    alerts.scan()
    return Alert.objects.get(task=task)


def badge(html: str) -> str | None:
    found = re.search(
        r'href="/console/alerts/"[^>]*>Alerts(?: <span class="pending-count"[^>]*>([^<]+)</span>)?', html
    )
    return (found.group(1) or "") if found else None


def test_the_page_needs_a_login(client):
    response = client.get(PAGE)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_page_lists_the_alerts_with_cause_and_a_link_to_the_task(operator, acme):
    alert = raised(acme, "Stuck refund")
    html = client_for(operator).get(PAGE).content.decode()
    assert f'href="/console/tasks/{alert.task_id}/"' in html
    assert alert.cause in html and "Stuck refund" in html
    assert f'action="/console/alerts/{alert.id}/acknowledge/"' in html


def test_another_tenants_alerts_never_show(operator, outsider, acme, globex):
    alert = raised(acme, "Acme's stuck refund")
    html = client_for(outsider).get(PAGE).content.decode()
    assert str(alert.task_id) not in html and "Acme's stuck refund" not in html
    assert (
        client_for(outsider)
        .post(f"/console/alerts/{alert.id}/acknowledge/", {"note": "x", "confirm": "on"})
        .status_code
        == 404
    )


def test_an_auditor_reads_but_gets_no_forms_and_cannot_post(auditor, acme):
    alert = raised(acme)
    html = client_for(auditor).get(PAGE).content.decode()
    assert alert.cause in html and "/acknowledge/" not in html and "/snooze/" not in html
    for action, body in (
        ("acknowledge", {"note": "x", "confirm": "on"}),
        ("snooze", {"duration": "1h", "confirm": "on"}),
    ):
        assert client_for(auditor).post(f"/console/alerts/{alert.id}/{action}/", body).status_code == 403
    assert not AlertNote.objects.exists()


def test_an_approver_has_no_alerts_page_nor_link(approver, acme):
    raised(acme)
    assert client_for(approver).get(PAGE).status_code == 403
    assert badge(client_for(approver).get("/console/approvals/").content.decode()) is None


def test_acknowledging_needs_the_confirmation_and_is_recorded(operator, acme):
    alert = raised(acme)
    client = client_for(operator)
    url = f"/console/alerts/{alert.id}/acknowledge/"
    refused = client.post(url, {"note": "restarting workers", "next": PAGE}, follow=True)
    assert "Tick the confirmation box" in refused.content.decode()
    assert not AlertNote.objects.exists()
    response = client.post(
        url, {"note": "restarting workers", "confirm": "on", "next": f"{PAGE}?kind=no_live_lease"}
    )
    assert response.status_code == 302 and response["Location"] == f"{PAGE}?kind=no_live_lease"
    alert.refresh_from_db()
    assert (
        alert.acknowledged_by_name == "acme-operator" and alert.acknowledgement_note == "restarting workers"
    )
    assert AlertNote.objects.get().by_name == "acme-operator"
    html = client.get(PAGE).content.decode()
    assert "acknowledged by acme-operator" in html and "restarting workers" in html


def test_the_way_back_stays_on_the_alerts_page(operator, acme):
    alert = raised(acme)
    response = client_for(operator).post(
        f"/console/alerts/{alert.id}/acknowledge/",
        {"note": "x", "confirm": "on", "next": "https://evil.example/"},
    )
    assert response["Location"] == PAGE


def test_snoozing_takes_the_alert_out_of_the_badge(operator, acme):
    first, _ = raised(acme, "one"), raised(acme, "two")
    client = client_for(operator)
    assert badge(client.get(PAGE).content.decode()) == "2"
    response = client.post(
        f"/console/alerts/{first.id}/snooze/", {"duration": "4h", "confirm": "on"}, follow=True
    )
    assert "snoozed until" in response.content.decode()
    first.refresh_from_db()
    assert first.snoozed_until is not None and first.snoozed_until > timezone.now() + timedelta(hours=3)
    assert badge(client.get(PAGE).content.decode()) == "1"
    assert client.get(PAGE).context["attention"] == 1  # the page's own count says the same


def test_the_badge_shows_on_every_page_and_only_counts_the_users_tenants(operator, outsider, acme, globex):
    raised(acme)
    assert badge(client_for(operator).get("/console/").content.decode()) == "1"
    assert badge(client_for(outsider).get("/console/").content.decode()) == ""  # a link, no count


def test_a_snooze_with_an_unknown_duration_records_nothing(operator, acme):
    alert = raised(acme)
    client_for(operator).post(f"/console/alerts/{alert.id}/snooze/", {"duration": "forever", "confirm": "on"})
    assert not AlertNote.objects.exists() and Alert.objects.get().snoozed_until is None


def test_filters_narrow_the_list_and_a_bad_one_is_a_400(operator, acme):
    alert = raised(acme, "first")
    other = raised(acme, "second")
    alerts.acknowledge(alert, user=operator, note="mine")
    client = client_for(operator)
    rows = client.get(PAGE, {"acknowledged": "false"}).context["page"].alerts
    assert [row.id for row in rows] == [other.id]
    rows = client.get(PAGE, {"task": str(alert.task_id)}).context["page"].alerts
    assert [row.id for row in rows] == [alert.id]
    rows = client.get(PAGE, {"status": "attention"}).context["page"].alerts
    assert [row.id for row in rows] == [other.id]
    Alert.objects.filter(pk=other.pk).update(cleared_at=timezone.now())
    assert [row.id for row in client.get(PAGE).context["page"].alerts] == [alert.id]
    assert [row.id for row in client.get(PAGE, {"status": "cleared"}).context["page"].alerts] == [other.id]
    assert client.get(PAGE, {"kind": "nonsense"}).status_code == 400
    assert client.get(PAGE, {"task": "not-an-id"}).status_code == 400


def test_the_page_reads_a_bounded_number_of_times_whatever_the_number_of_alerts(operator, acme):
    def queries() -> int:
        client = client_for(operator)
        with CaptureQueriesContext(connection) as captured:
            assert client.get(PAGE).status_code == 200
        return len(captured.captured_queries)

    alert = raised(acme)
    alerts.acknowledge(alert, user=operator, note="one")
    few = queries()
    for n in range(15):
        stuck(acme, f"more {n}")
    alerts.scan()
    for extra in Alert.objects.exclude(pk=alert.pk)[:5]:
        alerts.acknowledge(extra, user=operator, note="many")
    assert queries() == few
