"""Checkpoint schema versions across deployments: what this code reads, claims, leaves alone, migrates.

The checkpoint contract is one line in ``tasks.checkpoints`` (``Checkpoint = CheckpointV3``);
an older deployment differs by that line. These tests play the older and newer code inside one
process — a task row and checkpoint written as the other deployment would have written them
(``tests.foreign_checkpoints.written_as``: a real transition, so digest and audit event agree) —
and check the four rules of a mixed-version rollout: workers claim only what they can read; one
that meets a newer checkpoint anyway leaves the task untouched; one that migrates an older
checkpoint records it (``checkpoint_migrated``) and revalidates; ``checkpoints check`` says which
versions this code reads and how many tasks stand at each. Two real checkouts running at once:
``test_mixed_rollout``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit.models import TransitionEvent
from runtime import engine, runner
from runtime.llm import ScriptedModel
from tasks import checkpoints, decisions, leases, services
from tasks.checkpoints import CheckpointUnreadable
from tasks.models import Checkpoint, Lease, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import make_task
from tests.foreign_checkpoints import written_as

ROOT = Path(__file__).resolve().parents[2]
NEWER = checkpoints.CURRENT_SCHEMA + 1
pytestmark = pytest.mark.django_db


def as_v2(row: Checkpoint) -> str:
    """The body the v2 code would have written for this row: no region or ownership epoch."""
    document = json.loads(row.body)
    for field in ("region", "ownership_epoch"):
        document.pop(field)
    return json.dumps({**document, "schema_version": 2}, sort_keys=True, separators=(",", ":"))


def newer_body(row: Checkpoint) -> str:
    return json.dumps({"schema_version": NEWER, "step": "gather_evidence", "deployment": "next"})


def written_at_v2(tenant, **overrides) -> Task:
    """A ready task whose only checkpoint a v2 deployment wrote (the task row says so, too)."""
    with written_as(body=as_v2, schema_version=2):
        task = make_task(tenant, **overrides)
    Task.objects.filter(pk=task.pk).update(checkpoint_schema=2)  # as the v2 code's transition would set
    return Task.objects.get(pk=task.pk)


def waiting_for_input(task: Task) -> Task:
    return advance(
        task.id,
        task.state_version,
        State.WAITING_INPUT,
        actor=Actor.worker("w1"),
        trigger=Trigger.REQUEST_INPUT,
        progress=checkpoints.Progress(step="ask_customer"),
        wait_deadline=timezone.now() + timedelta(days=1),
    )


def events(task: Task) -> list[TransitionEvent]:
    return list(TransitionEvent.objects.filter(task=task).order_by("state_version"))


# --- the contract and the chain ------------------------------------------------------------------


def test_the_current_contract_is_v3_and_its_schema_follows_from_it():
    assert checkpoints.Checkpoint is checkpoints.CheckpointV3
    assert checkpoints.CURRENT_SCHEMA == 3
    source = (ROOT / "tasks" / "checkpoints.py").read_text()
    # The one line an older checkout changes (test_mixed_rollout relies on it).
    assert source.count("\nCheckpoint = CheckpointV3  # the current contract\n") == 1


def test_readable_is_the_current_schema_and_every_version_with_a_migration_path():
    assert checkpoints.READABLE == frozenset({1, 2, 3})
    assert checkpoints.migration_chain() == "1 -> 2 -> 3"
    assert NEWER not in checkpoints.READABLE and 0 not in checkpoints.READABLE


def test_a_v2_document_migrates_to_v3_with_unknown_region_and_epoch(acme):
    task = written_at_v2(acme)
    row = Checkpoint.objects.get(task=task)
    assert row.schema_version == 2 and "region" not in json.loads(row.body)

    document = services.latest_checkpoint(task)

    assert document.schema_version == 3 and isinstance(document, checkpoints.CheckpointV3)
    assert (document.region, document.ownership_epoch) == ("", 0)
    assert document.migrated_from == 2
    assert document.task_id == task.id and document.step == "gather_evidence"


def test_the_migration_is_pure_and_keeps_what_v2_had():
    v2 = {"schema_version": 2, "step": "x", "deployment": "d", "facts": {"a": 1}}
    migrated = checkpoints.MIGRATIONS[2](dict(v2))
    assert migrated == {**v2, "region": "", "ownership_epoch": 0}
    assert v2 == {"schema_version": 2, "step": "x", "deployment": "d", "facts": {"a": 1}}


def test_a_checkpoint_written_at_the_current_schema_says_it_was_not_migrated(acme):
    task = make_task(acme)
    document = services.latest_checkpoint(task)
    assert document.migrated_from is None
    assert (document.region, document.ownership_epoch) == (task.region, task.ownership_epoch)


def test_every_checkpoint_written_sets_the_task_rows_schema_and_none_other_changes_it(acme):
    task = make_task(acme)
    Task.objects.filter(pk=task.pk).update(checkpoint_schema=2)
    # A transition without a checkpoint leaves the column as it was ...
    task = advance(
        task.id, task.state_version, State.CANCEL_REQUESTED, actor=Actor.system("tests"),
        trigger=Trigger.CANCEL,
    )  # fmt: skip
    assert Task.objects.get(pk=task.pk).checkpoint_schema == 2
    # ... one with a checkpoint records the schema it wrote, in the same update.
    task = advance(
        task.id,
        task.state_version,
        State.CANCELED,
        actor=Actor.worker("w1"),
        trigger=Trigger.CANCEL_CONFIRMED,
        progress=checkpoints.Progress(step="gather_evidence"),
    )
    assert Task.objects.get(pk=task.pk).checkpoint_schema == checkpoints.CURRENT_SCHEMA
    assert Checkpoint.objects.filter(task=task).latest("state_version").schema_version == 3


def test_the_same_transition_code_writes_v2_under_the_older_contract(acme, monkeypatch):
    """What an older checkout runs: only the contract line differs, and it writes what v2 has."""
    monkeypatch.setattr(checkpoints, "Checkpoint", checkpoints.CheckpointV2)
    monkeypatch.setattr(checkpoints, "CURRENT_SCHEMA", 2)

    task = make_task(acme)

    row = Checkpoint.objects.get(task=task)
    body = json.loads(row.body)
    assert (row.schema_version, body["schema_version"]) == (2, 2)
    assert "region" not in body and "ownership_epoch" not in body
    assert Task.objects.get(pk=task.pk).checkpoint_schema == 2
    assert type(services.latest_checkpoint(task)) is checkpoints.CheckpointV2


# --- claims --------------------------------------------------------------------------------------


def test_a_worker_does_not_claim_a_task_whose_checkpoint_is_newer_than_it_reads(acme):
    task = make_task(acme)
    Task.objects.filter(pk=task.pk).update(checkpoint_schema=NEWER)

    assert leases.claim(task.id, worker_id="old", region=task.region) is None
    assert leases.claim_next(worker_id="old", region=task.region, limit=10) == []
    assert not Lease.objects.filter(task=task).exists()

    Task.objects.filter(pk=task.pk).update(checkpoint_schema=2)  # older: readable, migrated on resume
    [held] = leases.claim_next(worker_id="new", region=task.region, limit=10)
    assert held.task_id == task.id


# --- an older worker meeting a newer checkpoint --------------------------------------------------


def test_a_worker_meeting_a_newer_checkpoint_leaves_the_task_untouched_and_lets_go(acme, caplog):
    # The row still says a readable schema (a race: a newer deployment wrote after the claim's read).
    with written_as(body=newer_body, schema_version=NEWER):
        task = make_task(acme)
    before = (task.state, task.state_version, len(events(task)))

    outcome = runner.run_task(task.id, worker_id="old-worker", region=task.region)

    assert outcome == "checkpoint_newer"
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_version, len(events(stored))) == before
    assert stored.state_reason == ""
    lease = Lease.objects.get(task=task)
    assert lease.expires_at <= timezone.now()  # given back at once, for the newer deployment's workers
    assert "leaving the task to a newer deployment" in caplog.text


def test_a_newer_checkpoint_is_left_alone_from_every_state_other_reasons_still_quarantine(acme):
    with written_as(body=newer_body, schema_version=NEWER):
        newer = waiting_for_input(make_task(acme))
    with written_as(body='{"schema_version": 3, "step": ', schema_version=3):
        corrupt = waiting_for_input(make_task(acme))

    left = services.task_resume_point(newer.id, actor=Actor.system("tests"))
    quarantined = services.task_resume_point(corrupt.id, actor=Actor.system("tests"))

    assert left.newer and not left.quarantined
    assert Task.objects.get(pk=newer.pk).state == State.WAITING_INPUT
    assert quarantined.quarantined and not quarantined.newer
    assert Task.objects.get(pk=corrupt.pk).state_reason == CheckpointUnreadable.CORRUPT


# --- the migration, recorded ---------------------------------------------------------------------


def test_resuming_a_v2_checkpoint_records_the_migration_and_revalidates(acme):
    task = written_at_v2(acme)
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    model = ScriptedModel()

    decision = engine.decide(point.task, point.checkpoint, model=model, now=timezone.now())
    task = decisions.commit(point.task, decision, actor=Actor.worker("new-worker"))

    event = events(task)[-1]
    assert (event.from_state, event.to_state, event.trigger, event.reason_code) == (
        State.READY,
        State.RESUME_VALIDATION,
        Trigger.DEPLOYMENT_CHANGED,
        "checkpoint_migrated",
    )
    assert event.reason.startswith(f"checkpoint schema 2 migrated to 3 (deployment {settings.DEPLOYMENT_ID})")
    row = Checkpoint.objects.get(task=task, state_version=task.state_version)
    assert row.schema_version == 3 and json.loads(row.body)["region"] == task.region
    assert Task.objects.get(pk=task.pk).checkpoint_schema == 3

    # The migrated checkpoint passes validation, and the task goes on where it was.
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    assert point.checkpoint.migrated_from is None
    verdict = engine.decide(point.task, point.checkpoint, model=model, now=timezone.now())
    assert (verdict.to_state, verdict.trigger, verdict.reason_code) == (
        State.READY,
        Trigger.PROCEED,
        "revalidated",
    )
    assert verdict.progress.step == "gather_evidence"


def test_a_task_in_resume_validation_on_a_v2_checkpoint_records_the_migration_in_its_verdict(acme):
    task = written_at_v2(acme)
    # Into resume_validation by code that wrote no checkpoint: the newest is still the v2 one.
    task = advance(
        task.id, task.state_version, State.RESUME_VALIDATION, actor=Actor.worker("old-worker"),
        trigger=Trigger.DEPLOYMENT_CHANGED,
    )  # fmt: skip
    point = services.task_resume_point(task.id, actor=Actor.system("tests"))
    assert point.checkpoint.migrated_from == 2

    verdict = engine.decide(point.task, point.checkpoint, model=ScriptedModel(), now=timezone.now())
    task = decisions.commit(point.task, verdict, actor=Actor.worker("new-worker"))

    event = events(task)[-1]
    assert (event.from_state, event.to_state, event.trigger, event.reason_code) == (
        State.RESUME_VALIDATION,
        State.READY,
        Trigger.PROCEED,
        "checkpoint_migrated",
    )
    assert "checkpoint schema 2 migrated to 3" in event.reason and "evidence records hold" in event.reason
    assert Checkpoint.objects.get(task=task, state_version=task.state_version).schema_version == 3


# --- manage.py checkpoints check -----------------------------------------------------------------


def test_checkpoints_check_reports_versions_and_counts_and_newer_is_no_error(acme, capsys):
    current = make_task(acme)
    older = written_at_v2(acme)
    with written_as(body=newer_body, schema_version=NEWER):
        newer = make_task(acme)
    Task.objects.filter(pk=newer.pk).update(checkpoint_schema=NEWER)
    done = make_task(acme)
    Task.objects.filter(pk=done.pk).update(state=State.COMPLETED, checkpoint_schema=NEWER + 1)  # terminal

    call_command("checkpoints", "check", "--quarantine")

    out = capsys.readouterr().out
    assert f"this code: schema 3 (deployment {settings.DEPLOYMENT_ID})" in out
    assert "readable: 1, 2, 3" in out
    assert "migrations: 1 -> 2 -> 3" in out
    assert "  schema 2: 1 tasks — readable; migrated to 3 (and revalidated) when resumed" in out
    assert "  schema 3: 1 tasks — current" in out
    assert (
        f"  schema {NEWER}: 1 tasks — newer than this code; workers of this deployment will not claim them"
        in out
    )
    assert f"schema {NEWER + 1}:" not in out  # terminal tasks are not counted
    assert f"NEWER {newer.id} checkpoint_schema_newer" in out
    assert str(current.id) not in out and str(older.id) not in out
    assert "3 checked, 0 unreadable, 1 newer than this code (running schema 3)" in out
    assert Task.objects.get(pk=newer.pk).state == State.READY  # --quarantine left it for its deployment

    with pytest.raises(CommandError, match="1 checkpoints were written by newer code"):
        call_command("checkpoints", "check", "--strict")


def test_checkpoints_check_still_fails_on_an_unreadable_checkpoint(acme, capsys):
    with written_as(body='{"schema_version": 3, "step": '):
        broken = make_task(acme)

    with pytest.raises(CommandError, match="1 checkpoints cannot be read"):
        call_command("checkpoints", "check")

    assert f"UNREADABLE {broken.id} checkpoint_corrupt" in capsys.readouterr().out
