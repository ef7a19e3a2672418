"""Alerts: which tasks raise which alert, raised once, cleared when the task moves, handled and audited.

A seeded table holds one task of each kind of stuck, and the look-alikes that are
not stuck (a fresh task, one a worker holds, a three-day approval wait, a young
quarantine and a young unknown outcome, a finished task); ``scan`` must raise
exactly the expected alerts. Then the life of an alert: once across scans,
cleared by progress or by the condition ending, kept through an escalation,
acknowledged (audited, append-only) and snoozed (out of the badge until then);
and the API, scoped by tenant and role.
"""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from config.celery import app as celery_app
from runtime import alerts
from runtime.models import Alert, AlertKind, AlertNote
from tasks import leases
from tasks.models import Lease, Task
from tasks.selectors import stuck_condition
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tenancy.models import Role
from tenancy.services import token_create
from tests.api.conftest import cursor
from tests.conftest import api_client_for, make_task, make_user

pytestmark = pytest.mark.django_db

K = AlertKind
LONG_AGO = timedelta(hours=3)
WORKER = Actor.worker("w1")
OPS = Actor(ActorKind.OPERATOR, "user:acme-operator")


# --- builders ---------------------------------------------------------------------------------------


def aged(task: Task, by: timedelta = LONG_AGO) -> Task:
    """The task as if it entered its state ``by`` ago (the scan's thresholds read ``state_entered_at``)."""
    Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - by)
    return Task.objects.get(pk=task.pk)


def moved(task: Task, to: State, trigger: Trigger, actor: Actor = WORKER, **changes: Any) -> Task:
    return advance(task.id, task.state_version, to, actor=actor, trigger=trigger, **changes)


def waiting(task: Task, state: State, trigger: Trigger, deadline_in: timedelta) -> Task:
    return moved(task, state, trigger, wait_deadline=timezone.now() + deadline_in)


def quarantined(task: Task) -> Task:
    return moved(task, State.QUARANTINED, Trigger.QUARANTINE, reason_code="step_error")


def unknown(task: Task) -> Task:
    return moved(task, State.OUTCOME_UNKNOWN, Trigger.DISPATCH_UNKNOWN)


def cancel_requested(task: Task) -> Task:
    return moved(task, State.CANCEL_REQUESTED, Trigger.CANCEL, actor=OPS, reason_code="cancel:task")


def open_alerts() -> set[tuple[Any, str]]:
    return set(Alert.objects.filter(cleared_at__isnull=True).values_list("task_id", "kind"))


@pytest.fixture
def seeded(acme) -> dict[str, Task]:
    """One task per case, named by what it is."""
    t: dict[str, Task] = {}
    t["fresh"] = make_task(acme, objective="just created")
    t["unleased"] = aged(make_task(acme, objective="nobody took it"))
    t["held"] = aged(make_task(acme, objective="a worker holds it"))
    leases.claim(t["held"].id, worker_id="w1", region="default")
    approval = waiting(make_task(acme), State.WAITING_APPROVAL, Trigger.REQUEST_APPROVAL, timedelta(days=3))
    t["approval_3_days"] = aged(approval, timedelta(days=2))  # two days in, one to go: legitimate
    overdue = waiting(make_task(acme), State.WAITING_INPUT, Trigger.REQUEST_INPUT, timedelta(hours=1))
    Task.objects.filter(pk=overdue.pk).update(wait_deadline=timezone.now() - LONG_AGO)
    t["input_overdue"] = aged(overdue)
    t["unknown_young"] = unknown(make_task(acme))
    t["unknown_old"] = aged(unknown(make_task(acme)))
    t["quarantine_young"] = aged(quarantined(make_task(acme)), timedelta(minutes=10))
    t["quarantine_old"] = aged(quarantined(make_task(acme)))
    # A worker holds the cancel (so no "no lease" alert), but has not confirmed it for long.
    t["cancel_old"] = aged(cancel_requested(make_task(acme)))
    leases.claim(t["cancel_old"].id, worker_id="w1", region="default")
    t["cancel_young"] = cancel_requested(make_task(acme))
    leases.claim(t["cancel_young"].id, worker_id="w1", region="default")
    t["completed"] = aged(moved(make_task(acme), State.COMPLETED, Trigger.COMPLETE))
    return t


EXPECTED = {
    ("unleased", K.NO_LIVE_LEASE),
    ("input_overdue", K.WAIT_PAST_DEADLINE),
    ("unknown_old", K.UNKNOWN_OUTCOME_OVERDUE),
    ("quarantine_old", K.QUARANTINE_OVERDUE),
    ("cancel_old", K.CANCEL_UNCONFIRMED),
}


# --- classification ---------------------------------------------------------------------------------


def test_each_kind_of_stuck_task_raises_its_alert_and_the_look_alikes_raise_none(seeded):
    alerts.scan()
    assert open_alerts() == {(seeded[name].id, str(kind)) for name, kind in EXPECTED}


def test_an_alert_carries_its_cause_the_task_link_and_version(seeded):
    alerts.scan()
    alert = Alert.objects.get(task=seeded["unleased"], kind=K.NO_LIVE_LEASE)
    assert alert.tenant_id == seeded["unleased"].tenant_id
    assert alert.state_version == seeded["unleased"].state_version
    assert "ready" in alert.cause and "region “default”" in alert.cause
    quarantine = Alert.objects.get(task=seeded["quarantine_old"])
    assert "step_error" in quarantine.cause


def test_a_three_day_approval_wait_is_not_an_alert_even_after_days(acme):
    task = waiting(make_task(acme), State.WAITING_APPROVAL, Trigger.REQUEST_APPROVAL, timedelta(days=3))
    aged(task, timedelta(days=2, hours=23))
    alerts.scan()
    assert not Alert.objects.exists()


def test_the_stuck_filter_and_the_alerts_agree_on_the_stuck_clauses(seeded):
    """One source of truth: the tasks ?stuck=true lists are those with a stuck-kind alert."""
    alerts.scan()
    stuck = set(Task.objects.filter(stuck_condition(timezone.now())).values_list("id", flat=True))
    stuck_kinds = [K.NO_LIVE_LEASE, K.WAIT_PAST_DEADLINE, K.UNKNOWN_OUTCOME_OVERDUE]
    alerted = set(Alert.objects.filter(kind__in=stuck_kinds).values_list("task_id", flat=True))
    assert stuck == alerted == {seeded[name].id for name in ("unleased", "input_overdue", "unknown_old")}


def test_thresholds_come_from_settings(acme, settings):
    task = aged(quarantined(make_task(acme)), timedelta(minutes=10))
    alerts.scan()
    assert not Alert.objects.exists()
    settings.ALERT_QUARANTINE_AFTER = 300
    alerts.scan()
    assert open_alerts() == {(task.id, K.QUARANTINE_OVERDUE)}


def test_the_scan_is_set_based_its_queries_do_not_grow_with_the_tasks(acme):
    def queries_for_a_scan() -> int:
        with CaptureQueriesContext(connection) as captured:
            alerts.scan()
        return len(captured.captured_queries)

    for _ in range(2):
        aged(make_task(acme))
    few = queries_for_a_scan()
    for _ in range(20):
        aged(make_task(acme))
    assert queries_for_a_scan() == few
    assert Alert.objects.filter(kind=K.NO_LIVE_LEASE).count() == 22


# --- raised once, cleared when the task moves -------------------------------------------------------


def test_an_alert_is_raised_once_across_scans(seeded):
    first = alerts.scan()
    again = alerts.scan()
    assert sum(first.raised.values()) == len(EXPECTED)
    assert sum(again.raised.values()) == 0 and sum(again.cleared.values()) == 0
    assert Alert.objects.count() == len(EXPECTED)


def test_an_alert_clears_when_the_task_progresses(acme):
    task = aged(quarantined(make_task(acme)))
    alerts.scan()
    moved(task, State.RESUME_VALIDATION, Trigger.RELEASE, actor=OPS)
    report = alerts.scan()
    alert = Alert.objects.get(task=task)
    assert alert.cleared_at is not None and report.cleared[K.QUARANTINE_OVERDUE] == 1
    assert open_alerts() == set()


def test_an_alert_clears_when_its_condition_ends_without_a_transition(acme):
    task = aged(make_task(acme))
    alerts.scan()
    leases.claim(task.id, worker_id="w1", region="default")  # a worker came: no transition yet
    alerts.scan()
    assert Alert.objects.get(task=task).cleared_at is not None


def test_a_task_that_moved_and_is_stuck_again_gets_a_new_alert_at_its_new_version(acme):
    task = aged(make_task(acme))
    alerts.scan()
    task = moved(task, State.READY, Trigger.STEP)  # a step committed, then the worker vanished
    alerts.scan()
    old, new = Alert.objects.filter(task=task).order_by("id")
    assert old.cleared_at is not None and old.state_version == 1
    assert new.cleared_at is None and new.state_version == task.state_version == 2


def test_an_escalation_is_not_progress_the_alert_stays_open(acme):
    task = aged(unknown(make_task(acme)))
    alerts.scan()
    moved(task, State.OUTCOME_UNKNOWN, Trigger.ESCALATE, actor=Actor.system("reconciler"), escalation_level=1)
    alerts.scan()
    alert = Alert.objects.get(task=task)
    assert alert.cleared_at is None and alert.state_version == task.state_version


def test_a_cleared_alert_is_raised_anew_when_the_task_gets_stuck_again(acme):
    task = aged(make_task(acme))
    alerts.scan()
    leases.claim(task.id, worker_id="w1", region="default")
    alerts.scan()
    gone = timezone.now() - LONG_AGO  # the worker vanished long ago: its lease lapsed
    Lease.objects.filter(task=task).update(heartbeat_at=gone, expires_at=gone)
    alerts.scan()
    assert Alert.objects.filter(task=task).count() == 2
    assert Alert.objects.filter(task=task, cleared_at__isnull=True).count() == 1


def test_two_open_alerts_of_one_kind_for_one_task_are_refused_by_the_database(acme):
    task = aged(make_task(acme))
    alerts.scan()
    alert = Alert.objects.get(task=task)
    with pytest.raises(DatabaseError), transaction.atomic():
        Alert.objects.create(
            tenant=acme, task=task, kind=alert.kind, cause="again", raised_at=timezone.now(), state_version=1
        )


def test_beat_runs_the_scan_as_a_registered_celery_task(settings, acme):
    entry = settings.CELERY_BEAT_SCHEDULE["alerts-scan"]
    assert entry["task"] == "runtime.alerts_scan" and entry["schedule"] == 30.0
    celery_app.loader.import_default_modules()  # what a worker does at start: autodiscovery
    aged(make_task(acme))
    assert celery_app.tasks["runtime.alerts_scan"]() == {"raised": 1, "cleared": 0, "raised.no_live_lease": 1}


# --- acknowledging and snoozing -----------------------------------------------------------------------


@pytest.fixture
def alert(acme) -> Alert:
    aged(make_task(acme))
    alerts.scan()
    return Alert.objects.get()


def test_acknowledging_records_who_when_and_the_note_on_the_alert_and_in_an_append_only_note(
    alert, operator, admin_user
):
    acknowledged, first = alerts.acknowledge(alert, user=operator, note="restarting the workers")
    assert first
    assert acknowledged.acknowledged_by == operator and acknowledged.acknowledged_by_name == "acme-operator"
    assert acknowledged.acknowledged_at is not None
    assert acknowledged.acknowledgement_note == "restarting the workers"
    again, first = alerts.acknowledge(alert, user=admin_user, note="also looking")
    assert not first and again.acknowledged_by == operator  # the first acknowledgement stands
    notes = list(AlertNote.objects.filter(alert=alert).order_by("id").values_list("kind", "by_name", "note"))
    assert notes == [
        ("acknowledge", "acme-operator", "restarting the workers"),
        ("acknowledge", "acme-admin", "also looking"),
    ]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the append-only guard is PostgreSQL's")
def test_an_acknowledgement_cannot_be_rewritten_or_deleted(alert, operator):
    alerts.acknowledge(alert, user=operator, note="on it")
    note = AlertNote.objects.get()
    with pytest.raises(DatabaseError), transaction.atomic():
        AlertNote.objects.filter(pk=note.pk).update(note="nothing happened")
    with pytest.raises(DatabaseError), transaction.atomic():
        AlertNote.objects.filter(pk=note.pk).delete()
    assert AlertNote.objects.get().note == "on it"


def test_an_acknowledgement_needs_a_note(alert, operator):
    with pytest.raises(alerts.AlertRefused):
        alerts.acknowledge(alert, user=operator, note="   ")
    assert not AlertNote.objects.exists() and Alert.objects.get().acknowledged_at is None


def test_a_snoozed_or_acknowledged_alert_leaves_the_badge_and_a_snooze_ends(acme, operator):
    for _ in range(3):
        aged(make_task(acme))
    alerts.scan()
    first, second, _ = Alert.objects.order_by("id")
    assert alerts.attention_count(operator) == 3
    now = timezone.now()
    alerts.snooze(first, user=operator, until=now + timedelta(hours=1), note="deploy in progress")
    alerts.acknowledge(second, user=operator, note="mine")
    assert alerts.attention_count(operator) == 1
    assert alerts.attention_count(operator, now=now + timedelta(hours=2)) == 2  # the snooze ran out
    assert AlertNote.objects.get(kind="snooze").snoozed_until == now + timedelta(hours=1)


def test_a_snooze_must_end_in_the_future_and_within_the_limit_and_not_on_a_cleared_alert(alert, operator):
    now = timezone.now()
    for until in (now - timedelta(minutes=1), now + alerts.MAX_SNOOZE + timedelta(minutes=1)):
        with pytest.raises(alerts.AlertRefused):
            alerts.snooze(alert, user=operator, until=until, now=now)
    Alert.objects.filter(pk=alert.pk).update(cleared_at=now)
    with pytest.raises(alerts.AlertRefused) as refused:
        alerts.snooze(alert, user=operator, until=now + timedelta(hours=1))
    assert refused.value.status == 409
    assert not AlertNote.objects.exists()


def test_the_badge_counts_only_the_users_tenants(acme, globex, operator, outsider, approver):
    aged(make_task(acme))
    alerts.scan()
    assert alerts.attention_count(operator) == 1
    assert alerts.attention_count(outsider) == 0
    assert alerts.attention_count(approver) == 0  # approvers do not read alerts


# --- the API ----------------------------------------------------------------------------------------

ALERTS = "/api/alerts/"


def post(client, path: str, body: dict[str, Any]):
    return client.post(path, json.dumps(body), content_type="application/json")


def test_the_api_lists_open_alerts_of_the_callers_tenants_only(seeded, operator, auditor, outsider, globex):
    alerts.scan()
    other = aged(make_task(globex))
    alerts.scan()
    body = api_client_for(operator).get(ALERTS).json()
    assert {row["task"] for row in body["results"]} == {str(seeded[name].id) for name, _ in EXPECTED}
    row = body["results"][0]
    assert row["open"] is True and row["tenant"] == "acme" and row["task_url"].endswith(f"{row['task']}/")
    assert len(api_client_for(auditor).get(ALERTS).json()["results"]) == len(EXPECTED)
    theirs = api_client_for(outsider).get(ALERTS).json()["results"]
    assert [row["task"] for row in theirs] == [str(other.id)]


def test_the_api_filters_by_kind_task_acknowledged_and_open(seeded, operator):
    alerts.scan()
    client = api_client_for(operator)
    rows = client.get(ALERTS, {"kind": "wait_past_deadline"}).json()["results"]
    assert [row["task"] for row in rows] == [str(seeded["input_overdue"].id)]
    rows = client.get(ALERTS, {"task": str(seeded["unknown_old"].id)}).json()["results"]
    assert [row["kind"] for row in rows] == ["unknown_outcome_overdue"]
    alert = Alert.objects.get(task=seeded["unleased"])
    alerts.acknowledge(alert, user=operator, note="on it")
    rows = client.get(ALERTS, {"acknowledged": "true"}).json()["results"]
    assert [row["id"] for row in rows] == [alert.id] and rows[0]["notes"][0]["note"] == "on it"
    assert len(client.get(ALERTS, {"acknowledged": "false"}).json()["results"]) == len(EXPECTED) - 1
    Alert.objects.filter(pk=alert.pk).update(cleared_at=timezone.now())
    assert [row["id"] for row in client.get(ALERTS, {"open": "false"}).json()["results"]] == [alert.id]
    assert len(client.get(ALERTS, {"open": "any"}).json()["results"]) == len(EXPECTED)


def test_the_api_pages_with_a_cursor_newest_first(seeded, operator):
    alerts.scan()
    client = api_client_for(operator)
    seen, url = [], f"{ALERTS}?page_size=2"
    while url:
        body = client.get(url).json()
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert seen == list(Alert.objects.order_by("-id").values_list("id", flat=True))


@pytest.mark.parametrize(
    "query", [{"kind": "nonsense"}, {"task": "not-a-uuid"}, {"open": "maybe"}, {"cursor": cursor("p=zzz")}]
)
def test_a_bad_filter_is_a_400(operator, query):
    assert api_client_for(operator).get(ALERTS, query).status_code == 400


def test_reading_alerts_needs_a_reading_role(approver, integrator):
    assert api_client_for(approver).get(ALERTS).status_code == 403
    assert api_client_for(integrator).get(ALERTS).status_code == 403


def test_acknowledging_over_the_api(alert, operator):
    response = post(api_client_for(operator), f"{ALERTS}{alert.id}/acknowledge/", {"note": "on it"})
    assert response.status_code == 200, response.content
    assert response.json()["applied"] is True
    assert response.json()["alert"]["acknowledged_by_name"] == "acme-operator"
    again = post(api_client_for(operator), f"{ALERTS}{alert.id}/acknowledge/", {"note": "still on it"})
    assert again.status_code == 200 and again.json()["applied"] is False
    assert AlertNote.objects.count() == 2


def test_an_auditor_cannot_acknowledge_or_snooze_and_another_tenant_gets_404(alert, auditor, outsider):
    until = (timezone.now() + timedelta(hours=1)).isoformat()
    for suffix, body in (("acknowledge", {"note": "x"}), ("snooze", {"until": until})):
        assert post(api_client_for(auditor), f"{ALERTS}{alert.id}/{suffix}/", body).status_code == 403
        assert post(api_client_for(outsider), f"{ALERTS}{alert.id}/{suffix}/", body).status_code == 404
    assert not AlertNote.objects.exists()
    assert Alert.objects.get().acknowledged_at is None and Alert.objects.get().snoozed_until is None


def test_snoozing_over_the_api_and_its_refusals(alert, operator):
    client = api_client_for(operator)
    url = f"{ALERTS}{alert.id}/snooze/"
    past = post(client, url, {"until": (timezone.now() - timedelta(minutes=5)).isoformat()})
    assert past.status_code == 400 and "until" in past.json()
    assert post(client, url, {"until": "tomorrow-ish"}).status_code == 400
    until = timezone.now() + timedelta(hours=4)
    response = post(client, url, {"until": until.isoformat(), "note": "maintenance"})
    assert response.status_code == 200, response.content
    assert response.json()["alert"]["snoozed"] is True
    Alert.objects.filter(pk=alert.pk).update(cleared_at=timezone.now())
    assert post(client, url, {"until": until.isoformat()}).status_code == 409


def test_an_acknowledgement_without_a_note_is_a_400(alert, operator):
    for body in ({}, {"note": ""}, {"note": "  "}, {"note": "a\x00b"}):
        assert post(api_client_for(operator), f"{ALERTS}{alert.id}/acknowledge/", body).status_code == 400
    assert not AlertNote.objects.exists()


def test_tokens_need_read_to_list_and_operate_to_acknowledge(alert, acme):
    user = make_user("acme-opsbot", acme, Role.OPERATOR)
    expires = timezone.now() + timedelta(hours=1)

    def client(scope: str):
        _, key = token_create(user, scopes=[scope], expires_at=expires)
        return Client(HTTP_AUTHORIZATION=f"Token {key}")

    assert client("read").get(ALERTS).status_code == 200
    assert client("operate").get(ALERTS).status_code == 403
    assert post(client("read"), f"{ALERTS}{alert.id}/acknowledge/", {"note": "x"}).status_code == 403
    assert post(client("operate"), f"{ALERTS}{alert.id}/acknowledge/", {"note": "x"}).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_broker_less_worker_with_the_sweep_scans_for_alerts_too(acme):
    stuck = aged(make_task(acme, region="nowhere-served"))
    call_command("run_worker", "--sweep", "--once", "--region", "default", "--idle", "0", stdout=StringIO())
    assert open_alerts() == {(stuck.id, K.NO_LIVE_LEASE)}


@pytest.mark.parametrize(
    "suffix, body",
    [
        ("snooze", {"until": "9999-12-31T23:59:59-10:00"}),
        ("snooze", {"until": ["2030-01-01T00:00:00Z"]}),
        ("snooze", {"until": "2030-01-01T00:00:00Z", "note": "x" * 5000}),
        ("acknowledge", {"note": {"a": 1}}),
        ("acknowledge", {"note": "\ud800"}),
    ],
)
def test_hostile_bodies_are_a_400(alert, operator, suffix, body):
    client = api_client_for(operator)
    response = client.post(f"{ALERTS}{alert.id}/{suffix}/", json.dumps(body), content_type="application/json")
    assert response.status_code == 400, response.content
    assert not AlertNote.objects.exists()


def test_an_alert_id_beyond_any_integer_column_is_a_404(operator):
    client = api_client_for(operator)
    assert post(client, f"{ALERTS}{2**70}/acknowledge/", {"note": "x"}).status_code == 404
    console = Client()
    console.force_login(operator)
    assert console.post(f"/console/alerts/{2**70}/snooze/", {}).status_code == 404
