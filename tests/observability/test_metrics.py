"""``/metrics``: who may scrape it, and what it says after things happened.

The scripted scenario runs real transitions, dispatches, lookups and a worker's
cancel confirmation against a stand-in payments system (in memory, scripted per
call), then reads ``/metrics`` as Prometheus would. Counters and histograms
live in this process's memory for the whole test run, so each is compared as
the change across the scenario; the gauges read from the database are compared
as they are.
"""

from __future__ import annotations

import socket
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from config import metrics as metrics_config
from ledger import connectors
from ledger.connectors.base import Outcome, OutcomeUnknown
from ledger.models import Action, DispatchState
from runtime import controls, runner
from runtime.reconcile import reconcile_unknown
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task

pytestmark = pytest.mark.django_db

TOKEN = "metrics-test-token-0123456789"
Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class StandInPayments:
    """An authoritative payments system in memory; ``script`` says how the next dispatches go."""

    performed: dict[str, Outcome] = {}
    script: list[str] = []  # "replay": answers as to a repeated key; "lose": performs, answer lost

    def __init__(self, name: str):
        self.name = name

    def dispatch(self, key: str, effect: dict[str, Any]) -> Outcome:
        how = self.script.pop(0) if self.script else "ok"
        self.performed.setdefault(key, Outcome("succeeded", external_ref=f"pay-{len(self.performed) + 1}"))
        if how == "lose":
            raise OutcomeUnknown("the answer was lost on the way back")
        return Outcome("succeeded", external_ref=self.performed[key].external_ref, replayed=how == "replay")

    def lookup(self, key: str) -> Outcome | None:
        return self.performed.get(key)


@pytest.fixture(autouse=True)
def metrics_on(settings):
    settings.METRICS_CACHE_SECONDS = 0  # every scrape reads the database again
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOW_IPS = ["127.0.0.1/32"]
    assert metrics_config.configure()


@pytest.fixture
def payments(settings):
    settings.LEDGER_CONNECTORS = {**settings.LEDGER_CONNECTORS, "payments": f"{__name__}.StandInPayments"}
    connectors.get.cache_clear()
    yield StandInPayments
    StandInPayments.performed.clear()
    StandInPayments.script.clear()
    connectors.get.cache_clear()


def scrape(client, **headers) -> Series:
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    series: Series = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def value(series: Series, name: str, **labels: str) -> float:
    return series.get((name, frozenset(labels.items())), 0.0)


def family(series: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (sample, labels), v in series.items() if sample == name}


def run(task: Task) -> Task:
    runner.run_task(task.id, worker_id="metrics-worker", region="default")
    return Task.objects.get(pk=task.pk)


def control(task: Task, name: str, operator) -> Task:
    return controls.task_control(
        task,
        name,
        user=operator,
        roles=frozenset({"operator"}),
        expected_version=task.state_version,
        reason="m",
    ).task


def invoice(acme, number: int) -> Task:
    return make_task(
        acme,
        task_type="pay_invoice",
        objective=f"Pay INV-{number}",
        input={"invoice_id": f"INV-{number}", "amount": "25.00", "currency": "EUR"},
    )


# --- who may scrape -----------------------------------------------------------------------------------


def test_metrics_refuses_a_scrape_without_the_token_when_one_is_set(client, settings):
    settings.METRICS_TOKEN = TOKEN
    settings.METRICS_ALLOW_IPS = []
    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"durable_" not in missing.content + wrong.content
    assert client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200


def test_a_wrong_token_is_refused_even_from_an_allowed_address(client, settings):
    settings.METRICS_TOKEN = TOKEN
    assert client.get("/metrics").status_code == 200  # the test client's 127.0.0.1 is allowed
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401


def test_metrics_refuses_addresses_outside_the_allowed_networks(client, settings):
    settings.METRICS_ALLOW_IPS = ["10.0.0.0/8"]
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200


def test_a_request_through_a_proxy_is_not_trusted_for_its_loopback_address(client):
    # A reverse proxy on this host makes every outside caller arrive from 127.0.0.1.
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403


def test_a_console_session_does_not_open_metrics(client, settings, admin_user):
    settings.METRICS_ALLOW_IPS = []
    client.force_login(admin_user)
    assert client.get("/metrics").status_code == 403


def test_metrics_answers_only_reads(client):
    assert client.post("/metrics").status_code == 405


def test_a_worker_serves_its_own_series_on_loopback_without_the_databases(acme):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    metrics_config.serve(port)
    make_task(acme)  # a transition recorded in this process
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    names = {sample.name for family in text_string_to_metric_families(body) for sample in family.samples}
    assert "durable_task_transitions_total" in names
    assert not {"durable_tasks", "durable_gauges", "durable_task_wait_age_seconds_count"} & names


# --- what it says -------------------------------------------------------------------------------------


def test_after_the_scripted_scenario_metrics_shows_exactly_what_happened(client, acme, operator, payments):
    before = scrape(client)

    # One duplicate suppressed: the system answers the payment as a repeat of one it already holds.
    payments.script.append("replay")
    assert run(invoice(acme, 1)).state == State.COMPLETED

    # One unknown outcome, found performed 90 s after it became unknown.
    payments.script.append("lose")
    doubtful = run(invoice(acme, 2))
    assert doubtful.state == State.OUTCOME_UNKNOWN
    Action.objects.filter(task=doubtful).update(unknown_since=timezone.now() - timedelta(seconds=90))
    in_doubt = scrape(client)
    assert value(in_doubt, "durable_unknown_outcomes") == 1
    assert 90 <= value(in_doubt, "durable_unknown_outcome_oldest_age_seconds") < 100
    assert reconcile_unknown() == 1
    assert Action.objects.get(task=doubtful).dispatch_state == DispatchState.RECONCILED_SUCCEEDED

    # One cancellation, confirmed by a worker 30 s after it was requested.
    canceled = control(make_task(acme, objective="Cancel me"), "cancel", operator)
    Task.objects.filter(pk=canceled.pk).update(state_entered_at=timezone.now() - timedelta(seconds=30))
    assert run(canceled).state == State.CANCELED

    # One quarantine, by an operator.
    assert control(make_task(acme, objective="Hold me"), "quarantine", operator).state == State.QUARANTINED

    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # Counters and histograms recorded where it happened (this process).
    assert delta("durable_duplicates_suppressed_total", connector="payments") == 1
    assert delta("durable_reconciliations_total", result="reconciled_succeeded") == 1
    settled = {"result": "reconciled_succeeded"}
    assert delta("durable_unknown_outcome_duration_seconds_count", **settled) == 1
    assert delta("durable_unknown_outcome_duration_seconds_bucket", le="60.0", **settled) == 0
    assert delta("durable_unknown_outcome_duration_seconds_bucket", le="300.0", **settled) == 1
    assert 90 <= delta("durable_unknown_outcome_duration_seconds_sum", **settled) < 100
    assert delta("durable_cancellation_latency_seconds_count") == 1
    assert delta("durable_cancellation_latency_seconds_bucket", le="15.0") == 0
    assert delta("durable_cancellation_latency_seconds_bucket", le="60.0") == 1
    assert 30 <= delta("durable_cancellation_latency_seconds_sum") < 40
    for trigger, times in {
        "cancel": 1,
        "cancel_confirmed": 1,
        "quarantine": 1,
        "dispatch_unknown": 1,
        "reconciled": 1,
        "complete": 1,
    }.items():
        task_type = (
            "pay_invoice" if trigger in ("dispatch_unknown", "reconciled", "complete") else "refund_request"
        )
        assert delta("durable_task_transitions_total", trigger=trigger, task_type=task_type) == times, trigger
    assert delta("durable_task_transitions_total", trigger="start", task_type="pay_invoice") == 2
    assert delta("durable_task_transitions_total", trigger="start", task_type="refund_request") == 2

    # Gauges read from the database: this test's tasks are all there is.
    assert family(after, "durable_tasks") == {
        frozenset({("state", "completed"), ("task_type", "pay_invoice")}): 1,
        frozenset({("state", "ready"), ("task_type", "pay_invoice")}): 1,  # reconciled, not yet run again
        frozenset({("state", "canceled"), ("task_type", "refund_request")}): 1,
        frozenset({("state", "quarantined"), ("task_type", "refund_request")}): 1,
    }
    assert family(after, "durable_quarantined_tasks") == {frozenset({("reason", "quarantine")}): 1}
    assert value(after, "durable_unknown_outcomes") == 0
    assert value(after, "durable_unknown_outcome_oldest_age_seconds") == 0
    assert value(after, "durable_gauges", check="up") == 1


def test_waiting_tasks_are_a_histogram_of_their_time_in_state(client, acme):
    now = timezone.now()
    for minutes in (2, 2, 90):
        task = make_task(acme, objective=f"Wait {minutes}")
        Task.objects.filter(pk=task.pk).update(
            state=State.WAITING_INPUT, wait_deadline=now + timedelta(days=1),
            state_entered_at=now - timedelta(minutes=minutes),
        )  # fmt: skip
    series = scrape(client)
    waiting = {"state": "waiting_input"}
    assert value(series, "durable_task_wait_age_seconds_bucket", le="60.0", **waiting) == 0
    assert value(series, "durable_task_wait_age_seconds_bucket", le="300.0", **waiting) == 2
    assert value(series, "durable_task_wait_age_seconds_bucket", le="3600.0", **waiting) == 2
    assert value(series, "durable_task_wait_age_seconds_bucket", le="14400.0", **waiting) == 3
    assert value(series, "durable_task_wait_age_seconds_bucket", le="+Inf", **waiting) == 3
    assert value(series, "durable_task_wait_age_seconds_count", **waiting) == 3
    assert 94 * 60 <= value(series, "durable_task_wait_age_seconds_sum", **waiting) < 95 * 60
    assert value(series, "durable_task_wait_age_seconds_count", state="waiting_approval") == 0


def test_the_doorbell_lag_is_the_age_of_the_oldest_runnable_task_nobody_holds(client, acme):
    task = make_task(acme)
    Task.objects.filter(pk=task.pk).update(state_entered_at=timezone.now() - timedelta(minutes=5))
    lag = value(scrape(client), "durable_runnable_unleased_oldest_age_seconds", region="default")
    assert 300 <= lag < 310


def test_open_alerts_are_counted_by_kind(client, acme):
    from runtime.models import Alert, AlertKind

    task = make_task(acme)
    Alert.objects.create(
        tenant=acme, task=task, kind=AlertKind.NO_LIVE_LEASE, cause="c", raised_at=timezone.now()
    )
    Alert.objects.create(
        tenant=acme, task=task, kind=AlertKind.WAIT_PAST_DEADLINE, cause="c", raised_at=timezone.now(),
        cleared_at=timezone.now(),
    )  # fmt: skip
    alerts = family(scrape(client), "durable_alerts_open")
    assert alerts[frozenset({("kind", AlertKind.NO_LIVE_LEASE.value)})] == 1
    assert alerts[frozenset({("kind", AlertKind.WAIT_PAST_DEADLINE.value)})] == 0  # cleared


def test_the_database_reading_is_kept_for_metrics_cache_seconds(
    client, acme, settings, django_assert_num_queries
):
    settings.METRICS_CACHE_SECONDS = 60
    make_task(acme)
    assert value(scrape(client), "durable_tasks", state="ready", task_type="refund_request") == 1
    make_task(acme)
    with django_assert_num_queries(0):  # the kept reading, not the database
        kept = scrape(client)
    assert value(kept, "durable_tasks", state="ready", task_type="refund_request") == 1
    settings.METRICS_CACHE_SECONDS = 0
    assert value(scrape(client), "durable_tasks", state="ready", task_type="refund_request") == 2


def test_the_database_gauges_are_served_from_the_readings_runtime_provided_at_app_loading(client, acme):
    from runtime import gauges

    assert metrics_config.provided_readings() is gauges.READINGS
    make_task(acme)
    series = scrape(client)
    assert value(series, "durable_tasks", state="ready", task_type="refund_request") == 1
    assert value(series, "durable_task_wait_age_seconds_count", state="waiting_input") == 0
    assert value(series, "durable_gauges", check="up") == 1


def test_providing_the_readings_again_is_harmless_and_other_readings_are_refused():
    from runtime import gauges

    metrics_config.provide_readings(gauges.READINGS)  # RuntimeConfig.ready() running twice
    assert metrics_config.provided_readings() is gauges.READINGS
    other = metrics_config.Readings(
        snapshot=gauges.snapshot, alert_kinds=tuple, waiting_states=(), age_buckets=()
    )
    with pytest.raises(ValueError, match="already have their readings"):
        metrics_config.provide_readings(other)
    assert metrics_config.provided_readings() is gauges.READINGS


def test_without_readings_metrics_answers_with_its_own_series_and_no_database_gauges(
    client, acme, monkeypatch
):
    make_task(acme)
    monkeypatch.setattr(metrics_config, "_readings", None)  # a process where no layer provided them
    series = scrape(client)
    assert family(series, "durable_tasks") == {}
    assert value(series, "durable_task_wait_age_seconds_count", state="waiting_input") == 0
    assert value(series, "durable_gauges", check="up") == 0


def test_leases_heartbeats_approvals_and_verdicts_are_counted_where_they_happen(
    client, acme, operator, approver, django_capture_on_commit_callbacks
):
    from approvals import services as approvals
    from runtime import validation
    from runtime.heartbeats import Heartbeats
    from tasks import leases, registry
    from tasks import services as task_services
    from tasks.models import Lease
    from tests.console.test_approvals import ask

    before = scrape(client)
    now = timezone.now()
    held = make_task(acme)
    leases.claim(held.id, worker_id="w1", region="default")
    # w1 stopped heartbeating 20 s ago and its lease ran out: lapsed, not given up.
    Lease.objects.filter(task=held).update(heartbeat_at=now - timedelta(seconds=20), expires_at=now)
    with django_capture_on_commit_callbacks(execute=True):
        [taken] = leases.claim_next(worker_id="w2", region="default")
    beats = Heartbeats(timedelta(seconds=30))
    beats.hold(taken)
    beats.beat()

    decided = ask(make_task(acme, owner=operator, objective="Approve me"))
    approvals.approval_decide(decided, user=approver, decision="approve", digest_seen=decided.digest)
    left = ask(make_task(acme, owner=operator, objective="Nobody decides"))
    assert approvals.expire_pending(now=left.expires_at + timedelta(seconds=1)) == 1

    plain = make_task(acme, objective="Nothing changed")
    verdict = validation.validate(
        plain, task_services.latest_checkpoint(plain), registry.get(plain.task_type), timezone.now()
    )
    assert (verdict.trigger, verdict.reason_code) == ("proceed", "revalidated")
    after = scrape(client)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("durable_lease_expiries_total", cause="ttl") == 1
    assert delta("durable_lease_takeovers_total") == 1
    assert delta("durable_worker_heartbeats_total", worker="w2") == 1
    assert delta("durable_leases_lost_total", worker="w2") == 0
    assert delta("durable_approval_decision_latency_seconds_count", decision="approved") == 1
    assert delta("durable_approvals_expired_total") == 1
    assert delta("durable_resume_validations_total", verdict="proceed", reason="revalidated") == 1
