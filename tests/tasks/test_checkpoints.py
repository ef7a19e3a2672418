"""The checkpoint contract: round trip in a fresh process, migration, quarantine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from tasks import checkpoints, services
from tasks.checkpoints import CheckpointUnreadable
from tasks.models import Checkpoint, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.foreign_checkpoints import written_as

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def rich_progress() -> checkpoints.Progress:
    return checkpoints.Progress(
        step="ask_customer",
        input_refs=["task:input"],
        output_refs=["ticket:T-9"],
        facts={"damaged_item": "mug", "quantity": 2, "verified": True, "ratio": 0.5, "note": None},
        tool_calls=[
            checkpoints.ToolCallRecord(
                action_id="7", idempotency_key="k-1", step="open_ticket", outcome="succeeded"
            )
        ],
        approvals=[checkpoints.ApprovalRef(request_id="r-1", digest="ab" * 32, status="pending")],
        evidence=[
            checkpoints.EvidenceRef(
                system="orders",
                record_id="A-1",
                record_version="3",
                fetched_at=datetime(2026, 11, 1, 12, 0, tzinfo=UTC),
            )
        ],
    )


def park_waiting_for_input(tenant, **written: Any) -> Task:
    """A task waiting for input; ``written`` makes its checkpoint one other code wrote (``written_as``)."""
    task = make_task(tenant)
    with written_as(**written):
        return advance(
            task.id,
            1,
            State.WAITING_INPUT,
            actor=Actor.worker("w1"),
            trigger=Trigger.REQUEST_INPUT,
            progress=rich_progress(),
            wait_deadline=timezone.now() + timedelta(days=2),
        )


def damage_latest(task: Task, **fields) -> None:
    """Edit the newest checkpoint row by SQL, behind the application's back."""
    Checkpoint.objects.filter(task=task, state_version=task.state_version).update(**fields)


def manage(*args: str) -> subprocess.CompletedProcess:
    """Run manage.py in a fresh interpreter against the test database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings"}
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def test_encoding_is_canonical_and_round_trips():
    document = checkpoints.Checkpoint(
        **rich_progress().model_dump(),
        task_id="0190a0b0-0000-7000-8000-000000000001",
        state="ready",
        state_version=3,
        policy_version="p1",
        created_at=timezone.now(),
        state_entered_at=timezone.now(),
    )
    body = checkpoints.encode(document)
    assert checkpoints.decode(body) == document
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))


def test_the_json_schema_names_every_field_and_forbids_extras():
    schema = checkpoints.json_schema()
    assert schema["additionalProperties"] is False
    for name in (
        "schema_version",
        "task_id",
        "state",
        "state_version",
        "step",
        "tool_calls",
        "pending_actions",
        "approvals",
        "evidence",
        "policy_version",
        "runtime_config",
        "trace_link",
        "attempt",
    ):
        assert name in schema["properties"]


@pytest.mark.django_db(transaction=True)
def test_a_fresh_process_reads_back_and_resumes_the_same_checkpoint(acme):
    task = park_waiting_for_input(acme)
    written = services.latest_checkpoint(task).model_dump(mode="json")

    shown = manage("checkpoints", "show", str(task.id))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == written

    resumed = manage("checkpoints", "resume", str(task.id))
    assert resumed.returncode == 0, resumed.stderr
    point = json.loads(resumed.stdout)
    assert (point["state"], point["state_version"]) == (State.WAITING_INPUT, task.state_version)
    assert point["checkpoint"] == written
    assert point["checkpoint"]["facts"] == {
        "damaged_item": "mug",
        "quantity": 2,
        "verified": True,
        "ratio": 0.5,
        "note": None,
    }


@pytest.mark.parametrize(
    "damage,reason",
    [
        ({"body": '{"schema_version": 1, "step": ', "schema_version": 1}, CheckpointUnreadable.CORRUPT),
        (
            {"body": '{"schema_version": 1, "step": "x", "surprise": true}', "schema_version": 1},
            CheckpointUnreadable.CORRUPT,
        ),
        (
            {"body": '{"schema_version": 0, "step": "x"}', "schema_version": 0},
            CheckpointUnreadable.UNMIGRATABLE,
        ),
    ],
    ids=["not-json", "wrong-shape", "no-migration-path"],
)
def test_an_unreadable_checkpoint_quarantines_its_task_with_a_reason(acme, damage, reason):
    task = park_waiting_for_input(acme, **damage)

    point = services.task_resume_point(task.id, actor=Actor.system("tests"))

    assert point.quarantined
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_reason) == (State.QUARANTINED, reason)
    assert stored.state_version == task.state_version + 1
    assert stored.events.get(state_version=stored.state_version).reason_code == reason


def test_the_three_failure_kinds_have_distinct_reasons():
    assert (
        len(
            {
                CheckpointUnreadable.SCHEMA_NEWER,
                CheckpointUnreadable.CORRUPT,
                CheckpointUnreadable.UNMIGRATABLE,
            }
        )
        == 3
    )


def test_a_checkpoint_of_a_newer_schema_leaves_its_task_untouched(acme):
    """A newer deployment wrote it (a mixed-version rollout): not a fault to quarantine for."""
    newer = checkpoints.CURRENT_SCHEMA + 1
    task = park_waiting_for_input(acme, body=json.dumps({"schema_version": newer}), schema_version=newer)

    point = services.task_resume_point(task.id, actor=Actor.system("tests"))

    assert point.newer and not point.quarantined and point.checkpoint is None
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (State.WAITING_INPUT, task.state_version)


@pytest.mark.django_db(transaction=True)
def test_a_fresh_process_leaves_a_checkpoint_from_a_newer_deployment_untouched(acme):
    newer = checkpoints.CURRENT_SCHEMA + 1
    task = park_waiting_for_input(acme, body=json.dumps({"schema_version": newer}), schema_version=newer)

    result = manage("checkpoints", "resume", str(task.id))

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["checkpoint"] is None
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version) == (State.WAITING_INPUT, task.state_version)
    assert stored.events.count() == task.state_version  # no transition was added


def test_older_checkpoints_migrate_through_the_chain(acme, monkeypatch):
    seen: dict[str, Any] = {}

    def as_schema_0(row: Checkpoint) -> str:
        # A hypothetical schema 0 that spelled the step "position"; its migration is a pure function.
        seen["body"] = row.body
        current = json.loads(row.body)
        old = {
            **{k: v for k, v in current.items() if k != "step"},
            "position": current["step"],
            "schema_version": 0,
        }
        return json.dumps(old)

    monkeypatch.setitem(
        checkpoints.MIGRATIONS,
        0,
        lambda doc: {**{k: v for k, v in doc.items() if k != "position"}, "step": doc["position"]},
    )
    task = park_waiting_for_input(acme, body=as_schema_0, schema_version=0)

    point = services.task_resume_point(task.id, actor=Actor.system("tests"))

    assert not point.quarantined
    assert point.checkpoint == checkpoints.decode(seen["body"])  # as written, its sealed facts opened
    assert Task.objects.get(pk=task.pk).state == State.WAITING_INPUT


def test_a_failing_migration_quarantines_as_unmigratable(acme, monkeypatch):
    def broken(document):
        raise KeyError("position")

    monkeypatch.setitem(checkpoints.MIGRATIONS, 0, broken)
    task = park_waiting_for_input(acme, body='{"schema_version": 0}', schema_version=0)

    services.task_resume_point(task.id, actor=Actor.system("tests"))

    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_reason) == (State.QUARANTINED, CheckpointUnreadable.UNMIGRATABLE)
    assert "KeyError" in stored.events.get(state_version=stored.state_version).reason


def test_checkpoints_check_lists_what_the_running_code_cannot_read(acme, capsys):
    from django.core.management import CommandError, call_command

    healthy, damaged = park_waiting_for_input(acme), park_waiting_for_input(acme)
    damage_latest(damaged, body="garbage")
    with pytest.raises(CommandError, match="1 checkpoints"):
        call_command("checkpoints", "check", "--quarantine")
    out = capsys.readouterr().out
    assert str(damaged.id) in out and str(healthy.id) not in out
    assert Task.objects.get(pk=damaged.pk).state == State.QUARANTINED
    assert Task.objects.get(pk=healthy.pk).state == State.WAITING_INPUT


FIXTURES = sorted((ROOT / "tests" / "fixtures" / "checkpoints").glob("*.json"))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_stored_checkpoints_of_every_schema_still_decode(path):
    """Checkpoints written by earlier code, kept as fixtures, replayed against this code."""
    stored = json.loads(path.read_text())
    document = checkpoints.decode(path.read_text())
    assert document.schema_version == checkpoints.CURRENT_SCHEMA
    migrated = document.model_dump(mode="json")
    for field, value in stored.items():
        if field != "schema_version":
            assert migrated[field] == value, field


def test_a_v1_checkpoint_gains_an_unknown_deployment():
    document = checkpoints.decode((ROOT / "tests/fixtures/checkpoints/v1_waiting_input.json").read_text())
    assert document.deployment == ""
