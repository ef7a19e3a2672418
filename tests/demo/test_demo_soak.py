"""make demo-soak (``scripts/demo_soak.py``): its figures, the approver's codes, and when the demo counts as
stopped; and, under the ``slow`` marker, a short run of the real demo driven by every persona."""

from __future__ import annotations

import json
import signal
import socket
import sys
import time

import pytest

from demo.management.commands.seed_demo import DEMO_TOTP_SECRET
from demo.supervise import supervise
from scripts import demo_soak
from tests.second_factor import key_of
from tests.second_factor import totp_code as authenticator_code


def test_percentiles_are_nearest_rank_and_none_without_requests():
    values = [0.5, 0.1, 0.4, 0.2, 0.3, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert demo_soak.percentile(values, 50) == 0.5
    assert demo_soak.percentile(values, 95) == 1.0
    assert demo_soak.percentile(values, 100) == 1.0
    assert demo_soak.percentile([0.25], 95) == 0.25
    assert demo_soak.percentile(list(range(1, 101)), 95) == 95
    assert demo_soak.percentile([], 50) is None


def test_the_approvers_code_is_the_one_their_authenticator_shows():
    assert demo_soak.DEMO_TOTP_SECRET == DEMO_TOTP_SECRET  # the soak logs in as seed_demo's approver
    key = key_of(DEMO_TOTP_SECRET)
    for at in (0.0, 59.0, 1_700_000_000.0, time.time()):
        code, step = demo_soak.totp_code(DEMO_TOTP_SECRET, at=at)
        assert code == authenticator_code(key, at=at)
        assert step == int(at // 30)


def test_a_code_is_not_given_twice_in_one_step():
    at = 1_700_000_010.0
    first, step = demo_soak.totp_code(DEMO_TOTP_SECRET, at=at)
    again, next_step = demo_soak.totp_code(DEMO_TOTP_SECRET, at=at, after_step=step)
    assert next_step == step + 1
    assert again == authenticator_code(key_of(DEMO_TOTP_SECRET), at=at, after_step=step) != first


@pytest.mark.parametrize(
    ("status", "failure"), [(None, True), (500, True), (503, True), (200, False), (302, False), (404, False)]
)
def test_a_5xx_or_no_answer_is_a_failure_and_a_4xx_is_not(status, failure):
    assert demo_soak.is_failure(status) is failure


def test_restarts_are_counted_from_the_supervisors_own_words():
    said: list[str] = []
    handler = signal.getsignal(signal.SIGTERM)  # supervise takes SIGTERM over
    try:
        crasher = [sys.executable, "-c", "raise SystemExit(3)"]
        status = supervise({"worker": crasher}, {}, said.append, max_restarts=1, window=30, poll=0.05)
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert status == 1
    lines = [f"run_demo: {line}" for line in said]  # as run_demo writes them
    # One restart, then "stopping": the demo exits, which the soak sees as it stopping serving.
    assert [demo_soak.restarted(line) for line in lines] == ["worker", None]
    assert demo_soak.restarted("[04/Dec/2026 14:41:47] GET /console/ HTTP/1.1 200 31684") is None


def test_the_demo_stopped_serving_when_it_exited_or_was_not_ready_for_a_minute():
    assert demo_soak.stopped_serving([True, True, True], None) is None
    assert demo_soak.stopped_serving([], None) is None
    assert demo_soak.stopped_serving([True, False, True, False, True], None) is None  # blips
    assert demo_soak.stopped_serving([True, False, False, True], None) == "/readyz failed 2 times in a row"
    assert demo_soak.stopped_serving([True, True, False], None) == "the last /readyz poll failed"
    assert demo_soak.stopped_serving([True, True], 1) == "run_demo exited with code 1"


def test_a_minute_counts_errors_and_client_errors_apart_and_keeps_a_few_samples():
    minute = demo_soak.Minute(3)
    for status in (200, 200, 302, 404, 500):
        minute.record("queue", status, 0.1)
    for _ in range(6):
        minute.record("readyz", None, 30.0, "ConnectError")
    summary = minute.summary()
    counts = [summary[name] for name in ("minute", "requests", "errors", "client_errors")]
    assert counts == [3, 11, 7, 1]
    assert summary["p50_ms"] == summary["p95_ms"] == 100.0  # requests that got no answer have no latency
    assert summary["error_samples"] == ["queue: 500"] + ["readyz: ConnectError"] * 4


def test_totals_take_percentiles_over_every_request_and_the_peak_rss():
    quick, slow = demo_soak.Minute(0), demo_soak.Minute(1)
    for _ in range(19):
        quick.record("queue", 200, 0.01)
    slow.record("export", 200, 2.0)
    quick.rss_mb, slow.rss_mb = {"web": 180.0, "worker": 200.0}, {"web": 190.0, "worker": 195.0}
    quick.tasks_started, slow.tasks_started, slow.tasks_completed, slow.restarts = 4, 2, 5, 1
    figures = demo_soak.totals([quick, slow])
    assert figures["requests"] == 20 and figures["errors"] == 0
    assert figures["p50_ms"] == 10.0 and figures["p95_ms"] == 10.0  # 19 of 20 quick: not the minutes' mean
    assert (figures["tasks_started"], figures["tasks_completed"], figures["restarts"]) == (6, 5, 1)
    assert figures["rss_mb_peak"] == {"web": 190.0, "worker": 200.0}
    assert figures["rss_mb_first"] == quick.rss_mb and figures["rss_mb_last"] == slow.rss_mb


def test_it_never_wipes_a_var_directory_it_did_not_make(tmp_path):
    users = tmp_path / "var"
    users.mkdir()
    (users / "demo.sqlite3").write_text("someone's demo")
    with pytest.raises(SystemExit, match="is not a demo soak's"):
        demo_soak.fresh_var(users)
    assert (users / "demo.sqlite3").exists()
    ours = tmp_path / "soak"
    demo_soak.fresh_var(ours)
    (ours / "demo.sqlite3").write_text("the last soak's")
    demo_soak.fresh_var(ours)
    assert not (ours / "demo.sqlite3").exists()


def test_the_demo_runs_on_its_embedded_default_in_its_own_var(monkeypatch, tmp_path):
    monkeypatch.setenv("DATABASE_URL", "postgres://somewhere/else")
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://elsewhere")
    monkeypatch.setenv("CELERY_BEAT_SCHEDULE_FILENAME", "/elsewhere/schedule")
    env = demo_soak.demo_env(tmp_path)
    assert not {"DATABASE_URL", "CELERY_BROKER_URL", "CELERY_BEAT_SCHEDULE_FILENAME"} & set(env)
    assert env["VAR_DIR"] == str(tmp_path)
    assert env["DEBUG"] == env["SANDBOX_ENABLED"] == "1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(
    600
)  # its set-up (migrate, seed_demo) takes 15 s on a quiet machine, minutes on a busy one
def test_a_short_soak_keeps_serving_every_persona(tmp_path):
    out = tmp_path / "soak.json"
    status = demo_soak.main(
        [
            "--seconds",
            "60",
            "--think",
            "0.3",
            "--port",
            str(free_port()),
            "--var",
            str(tmp_path / "var"),
            "--out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert status == 0, result
    assert result["finished"] and result["verdict"]["serving"] and result["verdict"]["ok"]
    figures = result["totals"]
    assert figures["errors"] == 0 and figures["restarts"] == 0
    assert figures["requests"] > 20 and figures["readyz_polls"] >= 2
    assert figures["tasks_started"] > 0 and figures["tasks_completed"] > 0
    assert set(figures["rss_mb_last"]) == {"web", "worker", "beat"}
    log = (tmp_path / "var" / "run_demo.log").read_text()
    for page in ("/accounts/second-factor/", "/decide/", "/console/audit/export.csv", "POST /api/tasks/"):
        assert page in log  # the approver gave a code and decided; the auditor exported; tasks started
