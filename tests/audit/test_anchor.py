"""Anchors: signed chain heads written outside the database, and ``verify_audit --against`` them."""

from __future__ import annotations

import json
import os
import stat
from datetime import UTC, datetime
from unittest import mock

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from audit import anchor as anchor_module
from audit.anchor import write_anchor
from audit.keys import encode_private, encode_public
from audit.models import Tombstone
from audit.tombstones import make_tombstone, retention_path
from audit.workers import anchor as anchor_task
from audit.workers import anchor_if_due as anchor_if_due_task
from tasks.models import Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.audit.owner import task_with_history, triggers_off
from tests.conftest import make_task

pytestmark = pytest.mark.django_db


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def verify_against(path, capsys) -> tuple[bool, str, str]:
    try:
        call_command("verify_audit", "--against", str(path))
        ok = True
    except CommandError:
        ok = False
    out = capsys.readouterr()
    return ok, out.out, out.err


def retire(task: Task, reason: str = "retention: 400 days after completion") -> Tombstone:
    """What retention does, on the owner's path: a sealed tombstone, then the task and its history."""
    task = Task.objects.get(pk=task.pk)
    stone = make_tombstone(
        task_id=task.id,
        tenant_id=task.tenant_id,
        task_type=task.task_type,
        state_version=task.state_version,
        audit_head=task.audit_head,
        reason=reason,
    )
    with retention_path(), connection.cursor() as cursor:
        stone.save(force_insert=True)
        for table in ("tasks_checkpoint", "audit_transitionevent", "tasks_lease"):
            cursor.execute(f"DELETE FROM {table} WHERE task_id = %s", [task.id])
        cursor.execute("DELETE FROM tasks_task WHERE id = %s", [task.id])
    return stone


# --- Writing ------------------------------------------------------------------------------------


def test_an_anchor_holds_every_task_head_and_the_counts_per_tenant(acme, globex, tmp_path):
    ours, theirs = task_with_history(acme, steps=2), make_task(globex)

    written = write_anchor(tmp_path)

    records = lines(written.path)
    header, signature = records[0], records[-1]
    assert header["format"] == "durable-agents/audit-anchor" and header["chain_key_ids"] == ["dev"]
    tasks = {r["task"]: r for r in records if "task" in r}
    assert tasks == {
        str(t.id): {
            "task": str(t.id),
            "tenant": t.tenant_id,
            "version": t.state_version,
            "head": t.audit_head,
        }
        for t in Task.objects.filter(pk__in=[ours.pk, theirs.pk])
    }
    counts = {r["tenant"]: r for r in records if "events" in r}
    assert counts[acme.id] == {
        "tenant": acme.id,
        "tasks": 1,
        "events": 3,
        "tombstones": 0,
        "tombstoned_events": 0,
    }
    assert counts[globex.id]["tasks"] == 1 and counts[globex.id]["events"] == 1
    assert signature["signature"]["algorithm"] == "ed25519" and signature["tasks"] == written.tasks == 2


def test_an_anchor_reads_tasks_in_keyset_chunks_and_misses_none(
    acme, tmp_path, django_assert_max_num_queries
):
    made = {str(make_task(acme).id) for _ in range(7)}
    # 4 task chunks of 2, tombstones, 3 counts; the snapshot, when the chain was keyed, the run's row
    with django_assert_max_num_queries(4 + 1 + 3 + 3):
        written = write_anchor(tmp_path, chunk=2)
    listed = [r["task"] for r in lines(written.path) if "task" in r]
    assert set(listed) == made and listed == sorted(listed)


def test_an_anchor_is_read_only_and_never_replaces_another(acme, tmp_path):
    make_task(acme)
    moment = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    with mock.patch.object(anchor_module.timezone, "now", return_value=moment):
        first = write_anchor(tmp_path).path
        before = first.read_bytes()
        with pytest.raises(FileExistsError):
            write_anchor(tmp_path)  # same name: refused, not overwritten
    assert first.read_bytes() == before
    assert stat.S_IMODE(first.stat().st_mode) == 0o444
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # no temporary left behind


def test_the_command_and_the_beat_task_write_to_the_anchor_directory(acme, tmp_path, settings, capsys):
    settings.AUDIT_ANCHOR_DIR = tmp_path
    make_task(acme)
    call_command("audit_anchor")
    assert "1 tasks, 0 tombstones, 1 tenants" in capsys.readouterr().out
    written = anchor_task()
    assert written.startswith(str(tmp_path)) and len(list(tmp_path.glob("anchor-*.jsonl"))) == 2
    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-anchor"]  # beat polls; anchors when due
    assert entry["task"] == anchor_if_due_task.name == "audit.anchor_if_due"
    assert entry["schedule"] < django_settings.AUDIT_ANCHOR_INTERVAL


def test_the_anchor_job_runs_on_its_own_queue_not_on_the_region_workers_holding_only_public_keys():
    """Region workers hold the chain key; the anchor key that signs tombstones must not sit with it.
    Beat's poll and the one-off anchor go to the ``audit`` queue, which one worker holding that key
    consumes; the rest of beat's work stays with the region."""
    from config.celery import app

    def queue(name: str) -> str:
        return app.amqp.router.route({}, name)["queue"].name

    assert queue("audit.anchor_if_due") == queue("audit.anchor") == django_settings.AUDIT_QUEUE == "audit"
    assert queue("tasks.sweep") == django_settings.CELERY_TASK_DEFAULT_QUEUE != "audit"


# --- Verifying against it ---------------------------------------------------------------------


def test_an_untouched_database_verifies_against_its_latest_anchor(acme, globex, tmp_path, capsys):
    task_with_history(acme)
    make_task(globex)
    write_anchor(tmp_path)
    task_with_history(acme, steps=1)  # work after the anchor is not a problem
    newest = write_anchor(tmp_path).path

    ok, out, err = verify_against(tmp_path, capsys)  # a directory: its newest anchor

    assert ok and not err
    assert out.startswith(f"OK: 3 task chains verified; anchor {newest.name}")
    assert "signature valid, 3 anchored tasks and 0 tombstones match, counts of 2 tenants intact" in out


def test_a_task_that_moved_on_since_the_anchor_still_verifies(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    anchor = write_anchor(tmp_path).path
    advance(task.id, 2, State.READY, actor=Actor.worker("w"), progress=None)
    ok, out, _ = verify_against(anchor, capsys)
    assert ok and "1 anchored tasks" in out


def test_an_edited_anchor_fails_its_signature(acme, tmp_path, capsys):
    task = task_with_history(acme)
    path = write_anchor(tmp_path).path
    os.chmod(path, 0o644)  # whoever edits it must first make it writable
    path.write_text(path.read_text().replace('"version":4', '"version":3'))

    ok, _, err = verify_against(path, capsys)

    assert not ok
    assert err.splitlines() == [
        f"BROKEN anchor {path}: signature does not verify: the contents changed since it was signed"
    ]
    assert str(task.id) not in err  # nothing in an untrusted anchor is reported as fact


def test_an_anchor_with_its_signature_cut_off_is_refused(acme, tmp_path, capsys):
    make_task(acme)
    path = write_anchor(tmp_path).path
    os.chmod(path, 0o644)
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    ok, _, err = verify_against(path, capsys)
    assert not ok and "no signature line at its end" in err


def test_a_re_signed_anchor_is_refused_unless_its_key_is_trusted(acme, tmp_path, capsys, settings):
    make_task(acme)
    forger = Ed25519PrivateKey.generate()
    settings.AUDIT_ANCHOR_KEY = encode_private(forger)
    forged = write_anchor(tmp_path).path
    settings.AUDIT_ANCHOR_KEY = ""  # back to the real (here: development) key

    ok, _, err = verify_against(forged, capsys)
    assert not ok and "which is not trusted here (AUDIT_ANCHOR_PUBLIC_KEYS)" in err

    settings.AUDIT_ANCHOR_PUBLIC_KEYS = [encode_public(forger.public_key())]  # e.g. the previous key
    ok, _, _ = verify_against(forged, capsys)
    assert ok


def test_a_verifying_host_needs_only_the_public_key(acme, tmp_path, capsys, settings):
    make_task(acme)
    signer = Ed25519PrivateKey.generate()
    settings.AUDIT_ANCHOR_KEY = encode_private(signer)
    path = write_anchor(tmp_path).path
    settings.AUDIT_ANCHOR_KEY = encode_private(Ed25519PrivateKey.generate())  # this host signs with another
    settings.AUDIT_ANCHOR_PUBLIC_KEYS = [encode_public(signer.public_key())]
    ok, _, _ = verify_against(path, capsys)
    assert ok


def test_a_missing_anchor_is_a_clear_error(tmp_path):
    with pytest.raises(CommandError, match="no anchor in"):
        call_command("verify_audit", "--against", str(tmp_path))
    with pytest.raises(CommandError, match="no anchor file"):
        call_command("verify_audit", "--against", str(tmp_path / "anchor-x.jsonl"))


# --- Tombstones -------------------------------------------------------------------------------


def test_a_task_retention_deleted_with_a_tombstone_verifies_and_the_next_anchor_lists_it(
    acme, tmp_path, capsys
):
    gone, kept = task_with_history(acme), task_with_history(acme, steps=1)
    before = write_anchor(tmp_path).path

    stone = retire(gone)

    ok, out, err = verify_against(before, capsys)
    assert ok, err
    after = write_anchor(tmp_path).path
    tombstones = [r for r in lines(after) if "tombstone" in r]
    assert tombstones == [
        {
            "tombstone": str(gone.id),
            "tenant": acme.id,
            "version": 4,
            "head": stone.audit_head,
            "deleted_at": stone.deleted_at.astimezone(UTC).isoformat(timespec="microseconds"),
        }
    ]
    counts = next(r for r in lines(after) if "events" in r)
    assert (counts["tasks"], counts["tombstones"], counts["events"], counts["tombstoned_events"]) == (
        1,
        1,
        2,
        4,
    )
    ok, out, _ = verify_against(after, capsys)
    assert ok and "1 anchored tasks and 1 tombstones match" in out
    assert str(kept.id) in after.read_text()


def test_a_planted_tombstone_does_not_excuse_a_deleted_task(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    anchor = write_anchor(tmp_path).path
    stone = retire(task)
    with triggers_off("audit_tombstone") as cursor:  # the owner, without the chain key, plants a seal
        cursor.execute("UPDATE audit_tombstone SET mac = %s WHERE id = %s", ["0" * 64, stone.id])

    ok, _, err = verify_against(anchor, capsys)
    assert not ok
    assert (
        f"task {task.id} v2 (tenant {acme.id}): anchored, now deleted, and tombstone's seal does not match"
        in err
    )


def test_a_tombstone_older_than_the_anchor_does_not_excuse_a_deletion(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=2)
    anchor = write_anchor(tmp_path).path
    Task.objects.filter(pk=task.pk).update(state_version=2)  # retention is told of an earlier version
    retire(task)

    ok, _, err = verify_against(anchor, capsys)
    assert not ok and "its tombstone is at v2, before the anchored version" in err


def test_a_tombstone_gone_since_the_anchor_is_reported(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    retire(task)
    anchor = write_anchor(tmp_path).path
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL audit.retention = 'on'")
        cursor.execute("DELETE FROM audit_tombstone")

    ok, _, err = verify_against(anchor, capsys)
    assert not ok and f"tombstone of task {task.id} (tenant {acme.id}): anchored, now gone" in err
