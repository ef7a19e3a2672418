"""Tamper evidence against whoever holds the chain key: a database superuser with ``AUDIT_HMAC_KEYS``.

Each attack is what worked before (issue 20): the key holder deletes a live, anchored task and
writes a tombstone sealed with that key; appends a forged "approved" event after ``complete``
with a valid keyed link; rewrites a chain in the old unkeyed format. And what must stay clean: a
retention deletion, every path the workflows produce. Then the unanchored window: anchors on
demand after consequential commits, and the badge that shows how old the last one is.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from audit import canonical
from audit.anchor import anchor_if_due, write_anchor
from audit.chain import GENESIS, HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, event_hash, keyed_hash
from audit.keys import current_chain_key
from audit.models import AnchorRequest, Tombstone, TransitionEvent
from audit.tombstones import SEALED_FIELDS
from audit.verify import KEYED_MIGRATION, SIGNED_TOMBSTONES_MIGRATION
from protection import retention
from tasks.models import Task
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.audit.owner import delete_task, task_with_history, triggers_off
from tests.conftest import make_task, progress
from tests.security.test_retention import ended

pytestmark = pytest.mark.django_db

WORKER = Actor.worker("w")


def verify(*args: str, capsys) -> tuple[bool, str]:
    """``manage.py verify_audit *args``: (ok, stdout + stderr)."""
    try:
        call_command("verify_audit", *args)
        ok = True
    except CommandError:
        ok = False
    out = capsys.readouterr()
    return ok, out.out + out.err


def completed(tenant) -> Task:
    task = task_with_history(tenant, steps=1)
    return advance(task.id, task.state_version, State.COMPLETED, actor=WORKER, progress=progress("done"))


def append_forged(task: Task, **fields: object) -> TransitionEvent:
    """The key holder appends an event with a valid keyed link and moves the task's head to it."""
    task = Task.objects.get(pk=task.pk)
    last = TransitionEvent.objects.filter(task=task).order_by("-state_version").first()
    assert last is not None
    covered = {name: getattr(last, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
    covered.update(state_version=last.state_version + 1, created_at=timezone.now(), checkpoint_digest="")
    covered.update(fields)
    key = current_chain_key()
    event = TransitionEvent.objects.create(
        **covered, prev_hash=last.hash, hash=keyed_hash(last.hash, covered, key.secret), key_id=key.id
    )
    with triggers_off("tasks_task") as cursor:
        cursor.execute(
            "UPDATE tasks_task SET audit_head = %s, state_version = %s, state = %s WHERE id = %s",
            [event.hash, event.state_version, event.to_state, task.id],
        )
    return event


def chain_key_tombstone(task: Task) -> Tombstone:
    """A tombstone as the chain key alone can make one: the old HMAC seal, exactly as retention wrote it."""
    task = Task.objects.get(pk=task.pk)
    fields = {
        "task_id": task.id,
        "tenant_id": task.tenant_id,
        "task_type": task.task_type,
        "state_version": task.state_version,
        "audit_head": task.audit_head,
        "deleted_at": timezone.now(),
        "reason": "retention: completed since 2025-01-01; archive after 30 d, delete after 365 d (default)",
    }
    key = current_chain_key()
    text = canonical.dumps({name: fields[name] for name in SEALED_FIELDS}, version=canonical.V1)
    mac = hmac.new(key.secret, b"tombstone\n" + text.encode(), hashlib.sha256).hexdigest()
    return Tombstone.objects.create(**fields, key_id=key.id, mac=mac)


# --- Deleting a live task with a chain-key tombstone ------------------------------------------


def test_a_live_anchored_task_deleted_with_a_chain_key_tombstone_is_reported_against_the_anchor(
    acme, tmp_path, capsys
):
    live, kept = task_with_history(acme), task_with_history(acme, steps=1)
    anchor = write_anchor(tmp_path).path

    chain_key_tombstone(live)
    delete_task(live)

    ok, out = verify("--against", str(anchor), capsys=capsys)
    assert not ok
    assert (
        f"task {live.id} v4 (tenant {acme.id}): anchored, now deleted, and its tombstone is sealed with the "
        "chain key only (no anchor-key signature)" in out
    )
    assert str(kept.id) not in out


def test_a_task_deleted_between_anchors_with_a_chain_key_tombstone_is_reported_by_plain_verify_audit(
    acme, capsys
):
    """No anchor knew the task, but every tombstone of a task created since they were signed needs one."""
    task = task_with_history(acme, steps=1)
    chain_key_tombstone(task)
    delete_task(task)

    ok, out = verify(capsys=capsys)
    assert not ok
    deleted = f"task {task.id} (deleted, tenant {acme.id})"
    assert f"{deleted}: its tombstone is sealed with the chain key only" in out


def test_an_unsigned_tombstone_of_a_task_from_before_tombstones_were_signed_still_verifies(acme, capsys):
    task = task_with_history(acme, steps=1)
    chain_key_tombstone(task)
    delete_task(task)
    with connection.cursor() as cursor:  # as if migration 0010 came after this task (an upgrade)
        cursor.execute(
            "UPDATE django_migrations SET applied = clock_timestamp() WHERE app = %s AND name = %s",
            list(SIGNED_TOMBSTONES_MIGRATION),
        )

    ok, out = verify(capsys=capsys)
    assert ok and "OK: 0 task chains verified" in out, out


def test_a_real_tombstones_signature_copied_onto_a_forged_one_does_not_verify(acme, tmp_path, capsys):
    done, live = ended(acme, State.COMPLETED, 400), task_with_history(acme)
    anchor = write_anchor(tmp_path).path
    retention.run(dry_run=False)
    real = Tombstone.objects.get(task_id=done.id)

    forged = chain_key_tombstone(live)
    with triggers_off("audit_tombstone") as cursor:
        cursor.execute(
            "UPDATE audit_tombstone SET signing_key = %s, signature = %s WHERE id = %s",
            [real.signing_key, real.signature, forged.pk],
        )
    delete_task(live)

    ok, out = verify("--against", str(anchor), capsys=capsys)
    assert not ok
    assert (
        f"task {live.id} v4 (tenant {acme.id}): anchored, now deleted, and its tombstone's signature" in out
    )
    assert str(done.id) not in out


def test_a_retention_deletion_is_signed_with_the_anchor_key_and_verifies_clean(acme, tmp_path, capsys):
    gone, kept = ended(acme, State.COMPLETED, 400), task_with_history(acme, steps=1)
    before = write_anchor(tmp_path).path

    report = retention.run(dry_run=False)

    assert report.deleted == 1 and not Task.objects.filter(pk=gone.pk).exists()
    stone = Tombstone.objects.get(task_id=gone.id)
    assert stone.signing_key and len(stone.signature) == 88
    assert AnchorRequest.objects.filter(reason="retention").exists()  # the next poll anchors it
    ok, out = verify("--against", str(before), capsys=capsys)
    assert ok, out
    after = anchor_if_due(tmp_path)
    assert after is not None
    ok, out = verify("--against", str(after.path), capsys=capsys)
    assert ok and "1 anchored tasks and 1 tombstones match" in out, out
    assert kept.id


def test_retention_keeps_a_task_whose_chain_does_not_verify(acme):
    task = ended(acme, State.COMPLETED, 400)
    append_forged(task, from_state="completed", to_state="completed", trigger=Trigger.APPROVAL_DECIDED)

    report = retention.run(dry_run=False)

    assert report.deleted == 0 and Task.objects.filter(pk=task.pk).exists()
    assert not Tombstone.objects.filter(task_id=task.id).exists()


# --- Forged events with valid keyed links ---------------------------------------------------------


def test_an_approved_event_appended_after_complete_is_an_invalid_path(acme, tmp_path, capsys):
    task, other = completed(acme), completed(acme)
    anchor = write_anchor(tmp_path).path

    forged = append_forged(
        task,
        from_state=State.COMPLETED,
        to_state=State.COMPLETED,
        trigger=Trigger.APPROVAL_DECIDED,
        actor_kind=ActorKind.APPROVER,
        actor_id="user:mallory",
        reason="approved",
    )

    expected = (
        f"task {task.id} v{forged.state_version}: approver completed → completed by approval_decided after "
        "the task ended completed: after it the table allows only fork, late_effect_found"
    )
    ok, out = verify(capsys=capsys)
    assert not ok and expected in out and str(other.id) not in out
    ok, out = verify("--against", str(anchor), capsys=capsys)
    assert not ok and expected in out


def test_an_approval_written_as_a_real_one_after_complete_does_not_link_up(acme, capsys):
    task = completed(acme)

    forged = append_forged(
        task,
        from_state=State.WAITING_APPROVAL,
        to_state=State.RESUME_VALIDATION,
        trigger=Trigger.APPROVAL_DECIDED,
        actor_kind=ActorKind.APPROVER,
        actor_id="user:mallory",
    )

    ok, out = verify(capsys=capsys)
    assert not ok
    assert (
        f"task {task.id} v{forged.state_version}: starts in waiting_approval, but v{forged.state_version - 1}"
        " ended in completed" in out
    )


def test_an_approval_decision_without_a_pending_request_is_an_invalid_path(acme, capsys):
    task = task_with_history(acme, steps=1)

    forged = append_forged(
        task,
        from_state=State.READY,
        to_state=State.RESUME_VALIDATION,
        trigger=Trigger.APPROVAL_DECIDED,
        actor_kind=ActorKind.APPROVER,
        actor_id="user:mallory",
    )

    ok, out = verify(capsys=capsys)
    assert not ok
    assert (
        f"task {task.id} v{forged.state_version}: approver ready → resume_validation by approval_decided: "
        "approval_decided leaves only waiting_approval (nothing of the kind was pending)" in out
    )


def test_an_edge_taken_by_an_actor_the_table_does_not_allow_is_an_invalid_path(acme, capsys):
    task = task_with_history(acme, steps=1)

    append_forged(
        task,
        from_state=State.READY,
        to_state=State.COMPLETED,
        trigger=Trigger.COMPLETE,
        actor_kind=ActorKind.INTEGRATOR,
        actor_id="token:someone",
    )

    ok, out = verify(capsys=capsys)
    assert not ok and "integrator ready → completed by complete: no such edge in the transition table" in out


def test_a_task_row_moved_without_an_event_is_reported(acme, capsys):
    task = task_with_history(acme, steps=1)
    with triggers_off("tasks_task") as cursor:
        cursor.execute("UPDATE tasks_task SET state = 'completed' WHERE id = %s", [task.id])

    ok, out = verify(capsys=capsys)
    assert not ok and f"task {task.id} head: task is completed, its newest event ends in ready" in out


# --- Chains rewritten unkeyed ---------------------------------------------------------------------


def test_a_chain_rewritten_unkeyed_from_its_first_event_is_reported_by_plain_verify_audit(acme, capsys):
    """Every event rehashed with plain SHA-256 and backdated: the task's id still says when it was made."""
    task, other = task_with_history(acme, steps=2), task_with_history(acme, steps=1)
    long_ago = datetime(2024, 1, 1, tzinfo=UTC)
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    prev = GENESIS
    with triggers_off("audit_transitionevent") as cursor:
        for n, event in enumerate(events):
            fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
            fields.update(actor_id="worker:someone-else", created_at=long_ago + timedelta(minutes=n))
            link = event_hash(prev, fields)
            cursor.execute(
                "UPDATE audit_transitionevent SET actor_id = %s, created_at = %s, prev_hash = %s, hash = %s,"
                " key_id = '' WHERE id = %s",
                [fields["actor_id"], fields["created_at"], prev, link, event.id],
            )
            prev = link
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", [prev, task.id])

    ok, out = verify(capsys=capsys)
    assert not ok
    assert f"task {task.id} v1: unkeyed (legacy) event in the chain of a task created" in out
    assert "after the chain was keyed" in out and str(other.id) not in out


# --- Every path the workflows produce verifies --------------------------------------------------


def test_tasks_ended_every_way_retention_knows_verify_clean(acme, approver, capsys):
    """The retention suite's builder: completed, failed and expired tasks, with their evidence."""
    for state in (State.COMPLETED, State.FAILED, State.EXPIRED):
        ended(acme, state, 1, approver=approver)
    ok, out = verify(capsys=capsys)
    assert ok and "OK: 3 task chains verified" in out, out


# --- The unanchored window ------------------------------------------------------------------------


def test_an_anchor_is_written_on_demand_after_a_consequential_transition(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    first = anchor_if_due(tmp_path)
    assert first is not None  # none yet: due
    advance(task.id, task.state_version, State.READY, actor=WORKER, progress=progress("routine"))
    assert anchor_if_due(tmp_path) is None  # a routine step waits for the interval

    done = advance(task.id, task.state_version + 1, State.COMPLETED, actor=WORKER, progress=progress("end"))

    assert list(AnchorRequest.objects.values_list("reason", "task_id")) == [(Trigger.COMPLETE, task.id)]
    second = anchor_if_due(tmp_path)
    assert second is not None and second.path != first.path
    assert not AnchorRequest.objects.exists()
    ok, out = verify("--against", str(second.path), capsys=capsys)
    assert ok, out
    assert done.state == State.COMPLETED


def test_an_anchor_is_written_once_the_interval_has_passed(acme, tmp_path, settings):
    settings.AUDIT_ANCHOR_INTERVAL = 900
    make_task(acme)
    first = anchor_if_due(tmp_path)
    assert first is not None
    assert anchor_if_due(tmp_path, now=timezone.now() + timedelta(seconds=899)) is None
    later = timezone.now() + timedelta(seconds=901)
    assert anchor_if_due(tmp_path, now=later) is not None


def test_the_integrity_badge_shows_how_old_the_last_anchor_is(acme, auditor, client, tmp_path):
    task = task_with_history(acme, steps=1)
    client.force_login(auditor)
    url = reverse("console:audit-task", args=[task.id])
    assert "Not anchored yet: every event is covered by the chain key only" in client.get(url).text

    write_anchor(tmp_path)
    page = client.get(url).text
    assert "Anchored 0 min ago" in page and "every event of this task is in it" in page

    advance(task.id, task.state_version, State.READY, actor=WORKER, progress=progress("after"))
    page = client.get(url).text
    assert "Anchored 0 min ago" in page
    assert "this task's events after that are covered by the chain key only" in page


def test_the_command_anchors_only_when_due_with_if_due(acme, tmp_path, capsys):
    make_task(acme)
    call_command("audit_anchor", "--dir", str(tmp_path), "--if-due")
    assert "1 tasks" in capsys.readouterr().out
    call_command("audit_anchor", "--dir", str(tmp_path), "--if-due")
    assert "not due" in capsys.readouterr().out
    assert len(list(tmp_path.glob("anchor-*.jsonl"))) == 1


def test_moving_the_moment_the_chain_was_keyed_is_reported_against_the_anchor(acme, tmp_path, capsys):
    """The owner edits ``django_migrations`` so that unkeyed rewrites would pass as older history."""
    make_task(acme)
    anchor = write_anchor(tmp_path).path
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_migrations SET applied = clock_timestamp() WHERE app = %s AND name = %s",
            list(KEYED_MIGRATION),
        )

    ok, out = verify("--against", str(anchor), capsys=capsys)
    assert not ok and "by the database now (django_migrations edited" in out
