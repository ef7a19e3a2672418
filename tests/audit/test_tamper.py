"""Tamper evidence against a database owner, and what the application's role is refused (PostgreSQL).

Three layers, each tested here: the chain is keyed (HMAC with a key from the
environment), so rewriting it needs that key; an anchor outside the database
catches even a rewrite made with the key, a deleted task and a truncated log;
and the application connects as a role that owns nothing, which the triggers
and its privileges refuse every rewrite of history.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from audit.anchor import write_anchor
from audit.chain import GENESIS, HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, event_hash
from audit.models import TransitionEvent
from audit.verify import KEYED_MIGRATION, verify_task
from ledger.models import Action
from tasks.models import Checkpoint, Task
from tasks.states import State
from tasks.transitions import Actor, advance
from tests.audit.owner import delete_task, rewrite_event, task_with_history, triggers_off
from tests.conftest import make_task, progress
from tests.workflow import ROOT, database_url

pytestmark = pytest.mark.django_db

KEYS_A = "a:" + "A" * 40
KEYS_B_THEN_A = "b:" + "B" * 40 + "," + KEYS_A


def verify_against(anchor, capsys) -> tuple[bool, str, str]:
    """``verify_audit --against anchor``: (ok, stdout, stderr)."""
    try:
        call_command("verify_audit", "--against", str(anchor))
        ok = True
    except CommandError:
        ok = False
    out = capsys.readouterr()
    return ok, out.out, out.err


# --- The keyed chain ------------------------------------------------------------------------------


def test_new_events_are_keyed_with_the_current_key_and_record_its_id(acme, settings):
    settings.AUDIT_HMAC_KEYS = KEYS_A
    task = task_with_history(acme, steps=1)
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    assert [e.key_id for e in events] == ["a", "a"]
    fields = {name: getattr(events[0], name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
    assert events[0].hash != event_hash(GENESIS, fields)  # not the unkeyed hash anyone could compute
    assert verify_task(task) is None


def test_rotating_in_a_new_key_first_keeps_old_events_verifying(acme, settings, capsys):
    settings.AUDIT_HMAC_KEYS = KEYS_A
    task = task_with_history(acme, steps=1)
    settings.AUDIT_HMAC_KEYS = KEYS_B_THEN_A
    advance(task.id, 2, State.READY, actor=Actor.worker("w"), progress=progress("after rotation"))
    task_with_history(acme, steps=1)
    keys = (
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("key_id", flat=True)
    )
    assert list(keys) == ["a", "a", "b"]
    call_command("verify_audit")
    assert "OK: 2 task chains verified" in capsys.readouterr().out


def test_an_event_under_a_key_no_longer_configured_is_a_break_naming_the_key(acme, settings, capsys):
    settings.AUDIT_HMAC_KEYS = KEYS_A
    task = task_with_history(acme, steps=1)
    settings.AUDIT_HMAC_KEYS = "b:" + "B" * 40  # key a dropped too early
    with pytest.raises(CommandError, match="1 of 1"):
        call_command("verify_audit")
    err = capsys.readouterr().err
    assert f"task {task.id} v1: signed with key id 'a', which AUDIT_HMAC_KEYS does not hold" in err


def keyed_after_it() -> None:
    """As if the chain was keyed (audit migration 0008 applied) only now, after what came before."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_migrations SET applied = clock_timestamp() WHERE app = %s AND name = %s",
            list(KEYED_MIGRATION),
        )


def test_legacy_events_before_keyed_ones_verify(acme):
    task = make_task(acme)  # make its creation event look written before the chain was keyed
    event = TransitionEvent.objects.get(task=task)
    fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
    legacy = event_hash(GENESIS, fields)
    with triggers_off("audit_transitionevent") as cursor:
        cursor.execute(
            "UPDATE audit_transitionevent SET hash = %s, key_id = '' WHERE id = %s", [legacy, event.id]
        )
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", [legacy, task.id])
    keyed_after_it()

    advanced = advance(task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress("keyed"))

    keys = (
        TransitionEvent.objects.filter(task=task).order_by("state_version").values_list("key_id", flat=True)
    )
    assert list(keys) == ["", "dev"]
    assert verify_task(advanced) is None


def test_a_tail_recomputed_without_the_key_is_a_break(acme):
    """The attacker without the key rewrites v3 and rehashes forward with plain SHA-256."""
    task = task_with_history(acme)
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    prev = events[1].hash
    with triggers_off("audit_transitionevent") as cursor:
        for event in events[2:]:
            event.reason = "nothing happened" if event.state_version == 3 else event.reason
            fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
            link = event_hash(prev, fields)
            cursor.execute(
                "UPDATE audit_transitionevent SET reason = %s, prev_hash = %s, hash = %s, key_id = ''"
                " WHERE id = %s",
                [event.reason, prev, link, event.id],
            )
            prev = link
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", [prev, task.id])
    link = verify_task(Task.objects.get(pk=task.pk))
    assert link is not None and link.state_version == 3 and "never goes back to unkeyed" in link.problem


# --- An owner with the key, against an anchor --------------------------------------------------


def test_an_event_edited_and_rehashed_with_the_real_key_is_caught_by_the_anchor(acme, tmp_path, capsys):
    task, other = task_with_history(acme), task_with_history(acme)
    anchor = write_anchor(tmp_path).path

    rewrite_event(task, 2, reason="approved by the customer")

    call_command("verify_audit")  # the chain alone cannot tell: it was recomputed with the key
    assert "OK: 2 task chains verified" in capsys.readouterr().out
    ok, _, err = verify_against(anchor, capsys)
    assert not ok
    assert f"task {task.id} v4 (tenant {acme.id}): event hash differs from the anchored head" in err
    assert str(other.id) not in err


def test_a_deleted_task_is_caught_by_the_anchor(acme, tmp_path, capsys):
    task, kept = task_with_history(acme), task_with_history(acme, steps=1)
    anchor = write_anchor(tmp_path).path

    delete_task(task)

    call_command("verify_audit")  # nothing left to disagree with
    assert "OK: 1 task chains verified" in capsys.readouterr().out
    ok, _, err = verify_against(anchor, capsys)
    assert not ok
    lines = err.splitlines()
    assert f"BROKEN task {task.id} v4 (tenant {acme.id}): anchored, now deleted, and no tombstone" in lines
    assert any(
        f"tenant {acme.id}: 1 tasks now" in line and "1 deleted without a tombstone" in line for line in lines
    )
    assert any(f"tenant {acme.id}: 2 events now" in line and "4 events deleted" in line for line in lines)
    assert str(kept.id) not in err


def test_a_truncated_event_log_is_caught_by_the_anchor(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=1)
    anchor = write_anchor(tmp_path).path

    # The owner may TRUNCATE (docs/operating/tamper-evidence.md#database-roles).
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("TRUNCATE audit_transitionevent")

    ok, _, err = verify_against(anchor, capsys)
    assert not ok
    assert f"task {task.id} v2 (tenant {acme.id}): the anchored event is missing" in err
    assert f"tenant {acme.id}: 0 events now (counting tombstoned tasks'), 2 anchored" in err
    assert f"task {task.id} head: log ends at v0, task is at v2" in err


def test_a_chain_rewritten_as_legacy_from_its_first_event_is_caught_by_the_anchor(acme, tmp_path, capsys):
    task = task_with_history(acme, steps=2)
    anchor = write_anchor(tmp_path).path
    events = list(TransitionEvent.objects.filter(task=task).order_by("state_version"))
    prev = GENESIS
    with triggers_off("audit_transitionevent") as cursor:
        for event in events:
            fields = {name: getattr(event, name) for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
            fields["actor_id"] = "worker:someone-else"
            link = event_hash(prev, fields)
            cursor.execute(
                "UPDATE audit_transitionevent SET actor_id = %s, prev_hash = %s, hash = %s, key_id = ''"
                " WHERE id = %s",
                [fields["actor_id"], prev, link, event.id],
            )
            prev = link
        cursor.execute("UPDATE tasks_task SET audit_head = %s WHERE id = %s", [prev, task.id])

    ok, _, err = verify_against(anchor, capsys)
    assert (
        not ok and f"task {task.id} v3 (tenant {acme.id}): event hash differs from the anchored head" in err
    )


# --- The guards, as the owner sees them -----------------------------------------------------------


def test_a_checkpoint_body_may_be_rewritten_in_place_but_no_other_column(acme):
    task = task_with_history(acme, steps=1)
    rows = Checkpoint.objects.filter(task=task, state_version=2)
    body = rows.get().body
    assert rows.update(body=body.replace('"s0"', '"s0"')) == 1  # what key rotation does
    for change in ({"digest": "0" * 64}, {"state_version": 9}, {"codec": "other"}):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            rows.update(**change)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        rows.delete()
    with pytest.raises(ProtectedError):  # through the ORM: its events PROTECT the task, before any SQL
        Task.objects.filter(pk=task.pk).delete()


def test_a_task_row_is_never_deleted_by_sql(acme):
    task = make_task(acme)
    with pytest.raises(DatabaseError, match="tasks_task is append-only"), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM tasks_task WHERE id = %s", [task.id])
    assert Task.objects.filter(pk=task.pk).exists()


def test_an_action_moves_on_but_its_intent_is_frozen_and_it_is_never_deleted(acme):
    task = make_task(acme)
    now = timezone.now()
    action = Action.objects.create(
        task=task,
        step="pay",
        idempotency_key=f"k-{uuid.uuid4()}",
        connector="payments",
        effect={"amount": "1"},
        effect_digest="d" * 64,
        created_at=now,
        updated_at=now,
    )
    rows = Action.objects.filter(pk=action.pk)
    assert rows.update(dispatch_state="dispatching", attempts=1, effect={"amount": "1", "sealed": True}) == 1
    for change in ({"effect_digest": "e" * 64}, {"idempotency_key": "other"}, {"connector": "email"}):
        with pytest.raises(DatabaseError, match="may not change"), transaction.atomic():
            rows.update(**change)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        rows.delete()


def test_an_approval_decision_is_never_edited_or_deleted(acme, approver):
    task = make_task(acme)
    now = timezone.now()
    request = ApprovalRequest.objects.create(
        task=task,
        tenant=acme,
        step="ask",
        action_step="pay",
        waiting_version=1,
        consequential={},
        digest="a" * 64,
        policy_reason="r",
        policy_version="p",
        requested_by="worker:w",
        expires_at=now + timedelta(hours=1),
        created_at=now,
    )
    ApprovalDecision.objects.create(
        request=request, decision="approve", decided_by=approver, digest_seen="a" * 64, decided_at=now
    )
    decisions = ApprovalDecision.objects.filter(request=request)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        decisions.update(decision="reject")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        decisions.delete()
    assert decisions.get().decision == "approve"


def test_the_owner_deletes_history_only_on_the_retention_path(acme):
    task = task_with_history(acme, steps=1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TransitionEvent.objects.filter(task=task).delete()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL audit.retention = 'on'")
        for table in ("tasks_checkpoint", "audit_transitionevent"):
            cursor.execute(f"DELETE FROM {table} WHERE task_id = %s", [task.id])
        cursor.execute("DELETE FROM tasks_task WHERE id = %s", [task.id])
    assert not Task.objects.filter(pk=task.pk).exists()


# --- The application's role -----------------------------------------------------------------------


@pytest.fixture
def app_role(transactional_db):
    """A role made by ``db_roles`` (unique name), dropped afterwards; yields (name, connect)."""
    name = f"app_{uuid.uuid4().hex[:12]}"
    call_command("db_roles", "--app-role", name)
    db = connection.settings_dict
    conninfo = dict(host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, dbname=db["NAME"], user=name)
    opened: list[psycopg.Connection] = []

    def connect() -> psycopg.Connection:
        opened.append(psycopg.connect(**conninfo))
        return opened[-1]

    yield name, connect
    for conn in opened:
        conn.close()
    with connection.cursor() as cursor:
        cursor.execute(f"DROP OWNED BY {name}")
        cursor.execute(f"DROP ROLE {name}")


def refused(conn: psycopg.Connection, sql: str, params: list | None = None) -> str:
    """Run ``sql`` as the app role; the error it gets (the transaction is rolled back)."""
    try:
        with conn.transaction():
            conn.execute(sql, params)
    except psycopg.errors.InsufficientPrivilege as exc:
        return str(exc)
    raise AssertionError(f"the app role was allowed: {sql}")


def test_the_app_role_cannot_rewrite_delete_truncate_or_unguard_history(acme, app_role):
    name, connect = app_role
    task = task_with_history(acme, steps=1)
    conn = connect()
    event = "audit_transitionevent"
    assert "permission denied" in refused(
        conn, f"UPDATE {event} SET reason = 'x' WHERE task_id = %s", [task.id]
    )
    assert "permission denied" in refused(conn, f"DELETE FROM {event} WHERE task_id = %s", [task.id])
    assert "permission denied" in refused(conn, f"TRUNCATE {event}")
    assert "must be owner" in refused(conn, f"ALTER TABLE {event} DISABLE TRIGGER {event}_append_only")
    assert "must be owner" in refused(conn, f"ALTER TABLE {event} DISABLE TRIGGER USER")
    assert "must be owner" in refused(conn, f"DROP TRIGGER {event}_append_only ON {event}")
    assert "tasks_task is append-only (DELETE refused)" in refused(
        conn, "DELETE FROM tasks_task WHERE id = %s", [task.id]
    )
    with conn.transaction():  # the retention switch is the owner's alone
        conn.execute("SET LOCAL audit.retention = 'on'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"), conn.transaction():
            conn.execute("DELETE FROM tasks_checkpoint WHERE task_id = %s", [task.id])
    assert "permission denied" in refused(conn, "TRUNCATE tasks_checkpoint")
    assert "permission denied" in refused(conn, "CREATE TABLE mine (id int)")
    assert verify_task(Task.objects.get(pk=task.pk)) is None


def test_the_app_role_may_re_encrypt_a_checkpoint_body_but_not_change_its_digest(acme, app_role):
    name, connect = app_role
    task = task_with_history(acme, steps=1)
    conn = connect()
    with conn.transaction():
        changed = conn.execute(
            "UPDATE tasks_checkpoint SET body = body WHERE task_id = %s AND state_version = 2", [task.id]
        ).rowcount
    assert changed == 1
    assert "only {body} may change" in refused(
        conn, "UPDATE tasks_checkpoint SET digest = %s WHERE task_id = %s", ["0" * 64, task.id]
    )


def test_a_truncate_granted_by_mistake_is_still_refused_by_the_trigger(acme, app_role):
    name, connect = app_role
    task_with_history(acme, steps=1)
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT TRUNCATE ON audit_transitionevent TO {name}")
    assert "audit_transitionevent is append-only (TRUNCATE refused)" in refused(
        connect(), "TRUNCATE audit_transitionevent"
    )


def test_the_app_role_can_run_the_application(acme, app_role):
    """A task started and advanced by a process connected as the app role verifies, and anchors."""
    name, _ = app_role
    url = database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{name}@")
    script = (
        "from tenancy.models import Tenant; from tasks.services import task_create; "
        "from tasks.transitions import Actor, advance; from tasks import checkpoints; "
        "task, _ = task_create(tenant=Tenant.objects.get(slug='acme'), task_type='refund_request', "
        "objective='Refund A-1', input={'order_id': 'A-1', 'customer_email': 'c@example.com', "
        "'amount': '10.00', 'currency': 'USD'}, actor=Actor.system('app-role')); "
        "advance(task.id, 1, 'ready', actor=Actor.worker('w'), progress=checkpoints.Progress(step='s')); "
        "print(task.id)"
    )
    env = {**os.environ, "DATABASE_URL": url, "DEBUG": "1"}
    ran = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    task = Task.objects.get(pk=ran.stdout.strip().splitlines()[-1])
    assert task.state_version == 2 and verify_task(task) is None
    anchored = subprocess.run(
        [sys.executable, "manage.py", "verify_audit"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert anchored.returncode == 0 and "OK: 1 task chains verified" in anchored.stdout, anchored.stderr
