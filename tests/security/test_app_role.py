"""The app role holds only what the app needs (issue 20, item 5).

Reproduced before, connected with psycopg as the role ``manage.py db_roles`` made: an ``UPDATE`` or
``DELETE`` of the access log (reveals included), an ``UPDATE`` of a task's input and
``request_digest``, of an approval request's copies and requester, an ``INSERT`` of an admin
membership, and ``UPDATE auth_user SET is_superuser = true`` all went through; ``db_roles`` run
as an owner with ``CREATEROLE`` (no superuser) on PostgreSQL 15 stopped with a traceback; and a
production process started without the audit keys. Each write below is refused to the app role;
the application itself, connected as that role, still runs a payment through approval, escalation
and sending.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.anchor import Loss
from demo.sandbox.models import Effect
from ledger import restores
from ledger.models import Action, MoneyMovement, OrphanEffect, RestoreHead, RestoreLoss, RestoreRecord
from runtime import runner
from runtime.models import ModelUsage
from tasks.models import Task
from tasks.states import State
from tenancy.models import AccessEvent, Membership, Role
from tenancy.services import record_access
from tests.audit.test_tamper import app_role, refused  # noqa: F401 (app_role: a fixture)
from tests.conftest import make_task
from tests.security.test_defaults import manage, production_env
from tests.workflow import ROOT, database_url

User = get_user_model()
INVOICE = {"invoice_id": "INV-5", "amount": "5000.00", "currency": "EUR"}
SMALL = {"invoice_id": "INV-6", "amount": "40.00", "currency": "EUR"}  # under every limit: paid directly


def role_url(name: str) -> str:
    return database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{name}@")


@pytest.fixture
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    return settings.SANDBOX_BASE_URL


@pytest.fixture
def payment(sandbox, acme, operator) -> Task:
    """A payment of 5,000 EUR owned by the operator, waiting for an approver (its request pending)."""
    task = make_task(acme, task_type="pay_invoice", objective="Pay INV-5", input=INVOICE, owner=operator)
    runner.run_task(task.id, worker_id="test-worker", region="default")
    task.refresh_from_db()
    assert task.state == State.WAITING_APPROVAL, task.state
    return task


# --- the access log ---------------------------------------------------------------------------------


def test_the_app_role_cannot_rewrite_or_delete_the_access_log_reveals_included(acme, operator, app_role):  # noqa: F811
    name, connect = app_role
    reveal = record_access(AccessEvent.Kind.REVEAL, user=operator, tenant=acme, detail="task=1 field=card")
    conn = connect()
    for sql in (
        "UPDATE tenancy_accessevent SET detail = 'nothing' WHERE id = %s",
        "UPDATE tenancy_accessevent SET kind = 'login' WHERE id = %s",
        "DELETE FROM tenancy_accessevent WHERE id = %s",
    ):
        assert "permission denied" in refused(conn, sql, [reveal.pk])
    assert "permission denied" in refused(conn, "TRUNCATE tenancy_accessevent")
    with conn.transaction():  # the retention switch is the owner's alone
        conn.execute("SET LOCAL audit.retention = 'on'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege), conn.transaction():
            conn.execute("DELETE FROM tenancy_accessevent WHERE id = %s", [reveal.pk])
    assert AccessEvent.objects.get(pk=reveal.pk).detail == "task=1 field=card"


def test_the_access_log_trigger_refuses_what_a_mistaken_grant_would_allow(acme, operator, app_role):  # noqa: F811
    name, connect = app_role
    reveal = record_access(AccessEvent.Kind.REVEAL, user=operator, tenant=acme, detail="task=1 field=card")
    with connection.cursor() as cursor:
        cursor.execute(f"GRANT UPDATE, DELETE, TRUNCATE ON tenancy_accessevent TO {name}")
    conn = connect()
    assert "tenancy_accessevent is append-only (UPDATE refused: only {user_id} may change)" in refused(
        conn, "UPDATE tenancy_accessevent SET detail = 'nothing' WHERE id = %s", [reveal.pk]
    )
    assert "tenancy_accessevent is append-only (DELETE refused)" in refused(
        conn, "DELETE FROM tenancy_accessevent WHERE id = %s", [reveal.pk]
    )
    assert "tenancy_accessevent is append-only (TRUNCATE refused)" in refused(
        conn, "TRUNCATE tenancy_accessevent"
    )


def test_an_access_event_loses_only_its_account_when_the_owner_deletes_the_account(acme, operator, app_role):  # noqa: F811
    name, connect = app_role
    login = record_access(AccessEvent.Kind.LOGIN, user=operator)
    assert "permission denied" in refused(
        connect(), "UPDATE tenancy_accessevent SET user_id = NULL WHERE id = %s", [login.pk]
    )
    operator.delete()  # as the owner: Django sets the event's user to NULL, which the trigger lets through
    login.refresh_from_db()
    assert (login.user_id, login.username) == (None, "acme-operator")


# --- task input, approval copies, effects -----------------------------------------------------------


def test_the_app_role_cannot_rewrite_a_tasks_input_or_its_request_digest(acme, app_role):  # noqa: F811
    name, connect = app_role
    task = make_task(acme)
    conn = connect()
    forged = json.dumps({**task.input, "amount": "99999.00"})
    assert "permission denied" in refused(
        conn, "UPDATE tasks_task SET input = %s WHERE id = %s", [forged, task.id]
    )
    assert "permission denied" in refused(
        conn, "UPDATE tasks_task SET request_digest = %s WHERE id = %s", ["0" * 64, task.id]
    )
    for column, value in (
        ("objective", "Pay me"),
        ("task_type", "pay_invoice"),
        ("idempotency_key", "x"),
        ("owner_id", None),  # who asked decides who may approve
        ("rerun_of_id", None),
    ):
        assert "permission denied" in refused(
            conn, f"UPDATE tasks_task SET {column} = %s WHERE id = %s", [value, task.id]
        ), column
    with conn.transaction():  # what a transition writes is still the app's
        conn.execute("UPDATE tasks_task SET state_reason = state_reason WHERE id = %s", [task.id])
    task.refresh_from_db()
    assert task.input["amount"] == "10.00"


def test_the_app_role_cannot_rewrite_an_approval_requests_copies(payment, app_role):  # noqa: F811
    name, connect = app_role
    request = ApprovalRequest.objects.get(task=payment)
    conn = connect()
    forged = json.dumps({**request.consequential, "amount": "99999.00"})
    for column, value in (
        ("consequential", forged),
        ("material", "{}"),
        ("evidence", "[]"),
        ("digest", "0" * 64),
        ("requested_by", "nobody"),
        ("allowed_decisions", '["approve"]'),
        ("policy_reason", "no reason"),
    ):
        assert "permission denied" in refused(
            conn, f"UPDATE approvals_approvalrequest SET {column} = %s WHERE id = %s", [value, request.pk]
        ), column
    unchanged = ApprovalRequest.objects.get(pk=request.pk)
    assert (unchanged.digest, unchanged.consequential) == (request.digest, request.consequential)


def test_the_app_role_cannot_rewrite_a_queued_actions_effect(acme, app_role):  # noqa: F811
    name, connect = app_role
    now = timezone.now()
    action = Action.objects.create(
        task=make_task(acme),
        step="pay",
        idempotency_key=f"k-{uuid.uuid4()}",
        connector="payments",
        effect={"amount": "77.00", "currency": "EUR"},
        effect_digest="d" * 64,
        created_at=now,
        updated_at=now,
    )
    conn = connect()
    assert "permission denied" in refused(
        conn, "UPDATE ledger_action SET effect = %s WHERE id = %s", ['{"amount": "99999.00"}', action.pk]
    )
    with conn.transaction():  # dispatch progress is still the app's
        conn.execute("UPDATE ledger_action SET attempts = attempts + 1 WHERE id = %s", [action.pk])
    action.refresh_from_db()
    assert action.effect["amount"] == "77.00" and action.attempts == 1


def test_the_app_role_cannot_rewrite_the_api_token_a_task_was_started_with(acme, app_role):  # noqa: F811
    """The per-token running total reads it: moving a task to another token (or none) would reset it."""
    name, connect = app_role
    task = make_task(acme)
    assert "permission denied" in refused(
        connect(), "UPDATE tasks_task SET api_token_id = NULL WHERE id = %s", [task.id]
    )


def test_the_app_role_cannot_rewrite_or_delete_a_money_movement(sandbox, acme, operator, app_role):  # noqa: F811
    """What the money policy counts is history: not an amount lowered, not a payment forgotten."""
    name, connect = app_role
    task = make_task(acme, task_type="pay_invoice", objective="Pay INV-6", input=SMALL, owner=operator)
    runner.run_task(task.id, worker_id="test-worker", region="default")
    movement = MoneyMovement.objects.get(action__task=task)
    conn = connect()
    for sql in (
        "UPDATE ledger_moneymovement SET amount = 0 WHERE id = %s",
        "UPDATE ledger_moneymovement SET reference = '' WHERE id = %s",
        "DELETE FROM ledger_moneymovement WHERE id = %s",
    ):
        assert "permission denied" in refused(conn, sql, [movement.pk]), sql
    assert MoneyMovement.objects.get(pk=movement.pk).amount == movement.amount


def test_the_app_role_cannot_rewrite_or_delete_a_model_usage(acme, app_role):  # noqa: F811
    """What a task's model turns cost is history: not a count lowered, not a turn forgotten."""
    name, connect = app_role
    task = make_task(acme)
    usage = ModelUsage.objects.create(
        task=task, step="triage", state_version=1, attempt=0, model_id="scripted-v1", input_tokens=10,
        output_tokens=2, cost=None, committed=True, recorded_at=timezone.now(),
    )  # fmt: skip
    conn = connect()
    for sql in (
        "UPDATE runtime_modelusage SET input_tokens = 0 WHERE id = %s",
        "UPDATE runtime_modelusage SET cost = 0 WHERE id = %s",
        "DELETE FROM runtime_modelusage WHERE id = %s",
    ):
        assert "permission denied" in refused(conn, sql, [usage.pk]), sql
    assert ModelUsage.objects.get(pk=usage.pk).input_tokens == 10


def test_the_app_role_cannot_rewrite_what_recover_found_or_the_restore_it_recorded(acme, app_role):  # noqa: F811
    """After a restore, the orphan effects a system holds and the restore record are what operators
    settle from: the app may settle an orphan, never change what the system said or forget a restore."""
    name, connect = app_role
    now = timezone.now()
    orphan = OrphanEffect.objects.create(
        connector="payments", idempotency_key="k2.x:pay:0", tenant=acme, found_at=now,
        system_created_at=now, system_status="succeeded", record_id="pay-1",
    )  # fmt: skip
    restore = RestoreRecord.objects.create(tenant=acme, at=now, since=now, orphans=1, recorded=1)
    conn = connect()
    for sql, pk in (
        ("UPDATE ledger_orphaneffect SET system_status = 'failed' WHERE id = %s", orphan.pk),
        ("UPDATE ledger_orphaneffect SET idempotency_key = 'other' WHERE id = %s", orphan.pk),
        ("UPDATE ledger_restorerecord SET orphans = 0 WHERE id = %s", restore.pk),
        ("DELETE FROM ledger_restorerecord WHERE id = %s", restore.pk),
    ):
        assert "permission denied" in refused(conn, sql, [pk]), sql
    assert OrphanEffect.objects.get(pk=orphan.pk).system_status == "succeeded"
    assert RestoreRecord.objects.get(pk=restore.pk).orphans == 1


def test_the_app_role_appends_to_the_restore_chain_but_never_rewrites_what_a_restore_lost(acme, app_role):  # noqa: F811
    """The tasks a restore record names as lost are what excuses them against an old anchor: the app
    may add to them (a new record, the head moved on), never delete or change one."""
    name, connect = app_role
    now = timezone.now()
    record = RestoreRecord(tenant=acme, at=now, since=now, orphans=0, recorded=0)
    [record] = restores.append([(record, [Loss(str(uuid.uuid4()), acme.pk, 3, None)])])
    loss = RestoreLoss.objects.get(record=record)
    conn = connect()
    for sql, pk in (
        ("UPDATE ledger_restoreloss SET version_now = 3 WHERE id = %s", loss.pk),
        ("DELETE FROM ledger_restoreloss WHERE id = %s", loss.pk),
        ("UPDATE ledger_restorerecord SET tasks_lost = 0 WHERE id = %s", record.pk),
    ):
        assert "permission denied" in refused(conn, sql, [pk]), sql
    with conn.transaction():  # what ledger.restores.append does as the app: a loss row, the head moved
        conn.execute(
            "INSERT INTO ledger_restoreloss (record_id, task_id, version_anchored) VALUES (%s, %s, 1)",
            [record.pk, str(uuid.uuid4())],
        )
        conn.execute("UPDATE ledger_restorehead SET hash = %s WHERE id = %s", ["f" * 64, restores.HEAD_ID])
    assert RestoreHead.objects.get(pk=restores.HEAD_ID).hash == "f" * 64
    assert RestoreLoss.objects.get(pk=loss.pk).version_now is None


def test_the_app_role_cannot_remove_anyone_barred_from_deciding_a_request(payment, app_role):  # noqa: F811
    """``barred`` stays writable for escalations to extend it; emptying it would let the requester's
    co-causes (a rerunner, an escalator, an earlier decider) decide after all."""
    name, connect = app_role
    request = ApprovalRequest.objects.get(task=payment)
    assert "user:acme-operator" in request.barred
    conn = connect()
    for forged in ("{}", '{"user:acme-operator": []}', '{"user:someone-else": ["escalated"]}'):
        assert "barred only grows" in refused(
            conn, "UPDATE approvals_approvalrequest SET barred = %s WHERE id = %s", [forged, request.pk]
        ), forged
    with conn.transaction():  # an escalation adds its escalator: allowed
        conn.execute(
            "UPDATE approvals_approvalrequest SET barred = barred || %s WHERE id = %s",
            ['{"user:acme-admin": ["escalated"]}', request.pk],
        )
    assert set(ApprovalRequest.objects.get(pk=request.pk).barred) == {"user:acme-operator", "user:acme-admin"}


# --- memberships and account privileges -------------------------------------------------------------


def test_the_app_role_cannot_grant_change_or_revoke_a_membership(acme, operator, approver, app_role):  # noqa: F811
    name, connect = app_role
    conn = connect()
    held = Membership.objects.get(user=approver, tenant=acme, role=Role.APPROVER)
    assert "permission denied" in refused(
        conn,
        "INSERT INTO tenancy_membership (user_id, tenant_id, role) VALUES (%s, %s, 'admin')",
        [operator.pk, acme.pk],
    )
    assert "permission denied" in refused(
        conn, "UPDATE tenancy_membership SET role = 'admin' WHERE id = %s", [held.pk]
    )
    assert "permission denied" in refused(conn, "DELETE FROM tenancy_membership WHERE id = %s", [held.pk])
    assert not Membership.objects.filter(user=operator, role=Role.ADMIN).exists()
    assert Membership.objects.filter(pk=held.pk, role=Role.APPROVER).exists()


def test_the_app_role_cannot_make_anyone_staff_or_superuser(operator, app_role):  # noqa: F811
    name, connect = app_role
    conn = connect()
    for column in ("is_superuser", "is_staff"):
        problem = refused(conn, f"UPDATE auth_user SET {column} = true WHERE id = %s", [operator.pk])
        assert "is_superuser and is_staff are set by the owner role only" in problem
    problem = refused(
        conn,
        "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff, "
        "is_active, date_joined) VALUES ('!', true, 'mallory', '', '', '', true, true, now())",
    )
    assert "is_superuser and is_staff are set by the owner role only" in problem
    operator.refresh_from_db()
    assert not (operator.is_superuser or operator.is_staff)
    assert not User.objects.filter(username="mallory").exists()


def test_the_app_role_still_writes_passwords_and_last_login(operator, app_role):  # noqa: F811
    name, connect = app_role
    conn = connect()
    with conn.transaction():
        conn.execute(
            "UPDATE auth_user SET password = '!changed', last_login = now(), is_superuser = false "
            "WHERE id = %s",
            [operator.pk],
        )  # a full save() leaves the flags as they were: allowed
    operator.refresh_from_db()
    assert operator.password == "!changed" and operator.last_login is not None


# --- the application, connected as the app role -------------------------------------------------------

FLOW = """
import json
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone
from django.test import Client
from approvals.models import ApprovalRequest
from runtime import runner
from tasks.models import Task
from tenancy.models import AccessEvent
from tests.second_factor import mark_verified

User = get_user_model()
operator, admin = User.objects.get(username="{operator}"), User.objects.get(username="{admin}")

def client(user):
    c = Client()
    c.force_login(user)  # last_login, a session, a login access event
    mark_verified(c, user)  # the admin's second factor: a device and the session's mark, as the app role
    return c

def post(c, path, body):
    response = c.post(path, json.dumps(body), content_type="application/json")
    assert response.status_code in (200, 201, 202), (path, response.status_code, response.content[:500])
    return response.json()

as_operator, as_admin = client(operator), client(admin)
started = post(as_operator, "/api/tasks/", {{"task_type": "pay_invoice", "objective": "Pay INV-5",
                                            "input": {invoice}}})
task = Task.objects.get(pk=started["id"])
runner.run_task(task.id, worker_id="app-role-worker", region="default")
task.refresh_from_db()
assert task.state == "waiting_approval", task.state
post(as_operator, f"/api/tasks/{{task.id}}/escalate/",
     {{"expected_version": task.state_version, "reason": "needs a senior look", "escalate_to": "admin"}})
request = ApprovalRequest.objects.get(task=task)
assert request.approver_role == "admin"
decided = post(as_admin, f"/api/approvals/{{request.pk}}/decide/",
               {{"decision": "approve", "digest": request.digest}})
assert decided["applied"] is True, decided
runner.run_task(task.id, worker_id="app-role-worker", region="default")
operator.set_password("a new and long passphrase")
operator.save()  # every column, the flags unchanged
with connection.cursor() as cursor:
    cursor.execute("SELECT current_user")
    (user,) = cursor.fetchone()
print(json.dumps({{"task": str(task.id), "user": user}}))
"""


def test_the_application_runs_a_payment_through_approval_and_escalation_as_the_app_role(
    sandbox,
    acme,
    operator,
    admin_user,
    app_role,  # noqa: F811
):
    name, _ = app_role
    script = FLOW.format(operator=operator.username, admin=admin_user.username, invoice=json.dumps(INVOICE))
    ran = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": role_url(name), "DEBUG": "1", "SANDBOX_BASE_URL": sandbox},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    shown = json.loads(ran.stdout.strip().splitlines()[-1])
    assert shown["user"] == name
    task = Task.objects.get(pk=shown["task"])
    assert task.state == State.COMPLETED, task.state
    assert Effect.objects.filter(system="payments").count() == 1
    assert AccessEvent.objects.filter(kind=AccessEvent.Kind.LOGIN, user=operator).exists()
    before = operator.password
    operator.refresh_from_db()
    assert operator.password != before and operator.last_login is not None


RERUN_FLOW = """
import json, time
from pathlib import Path
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from audit.anchor import anchor_if_due
from audit.models import AnchorRequest
from demo.sandbox.models import Effect, Fault
from ledger.models import MoneyMovement
from runtime import runner
from tasks.models import Task

operator = get_user_model().objects.get(username="{operator}")
as_operator = Client()
as_operator.force_login(operator)

def post(path, body):
    response = as_operator.post(path, json.dumps(body), content_type="application/json")
    assert response.status_code in (200, 201, 202), (path, response.status_code, response.content[:500])
    return response.json()

def run(task_id):
    runner.run_task(task_id, worker_id="app-role-worker", region="default")
    return Task.objects.get(pk=task_id)

# The payment lands while its answer times out; the operator cancels; the cancel finds it paid.
Fault.objects.create(system="payments", operation="dispatch", kind="timeout", params={{"seconds": 1}})
started = post("/api/tasks/", {{"task_type": "pay_invoice", "objective": "Pay INV-6", "input": {invoice}}})
task = run(started["id"])
assert task.state == "outcome_unknown", task.state
deadline = time.monotonic() + 10
while not Effect.objects.filter(system="payments").exists():
    assert time.monotonic() < deadline, "the payment never landed"
    time.sleep(0.05)
post(f"/api/tasks/{{task.id}}/cancel/", {{"expected_version": task.state_version, "reason": "withdrawn"}})
task = run(task.id)
assert task.state == "canceled", (task.state, task.state_reason)
assert MoneyMovement.objects.filter(action__task=task).count() == 1  # inserted with the intent
rerun = run(post(f"/api/tasks/{{task.id}}/rerun/", {{"reason": "try again"}})["id"])
assert rerun.state == "completed", (rerun.state, rerun.state_reason)
assert rerun.events.filter(reason_code="effect_reused").exists()
assert AnchorRequest.objects.exists()  # rung by the consequential transitions, as the app role
written = anchor_if_due(Path("{anchors}"))  # the beat's job, as the app role
assert written is not None and not AnchorRequest.objects.exists()
with connection.cursor() as cursor:
    cursor.execute("SELECT current_user")
    (user,) = cursor.fetchone()
print(json.dumps({{"task": str(task.id), "rerun": str(rerun.id), "user": user}}))
"""


def test_the_application_reuses_a_paid_effect_on_rerun_and_anchors_as_the_app_role(
    sandbox,
    acme,
    operator,
    app_role,  # noqa: F811
    tmp_path,
):
    """A payment under the money policy (its movement), a cancel that finds it paid, an operator's
    rerun that reuses it, and the anchor job answering the doorbells: all as the app role."""
    name, _ = app_role
    script = RERUN_FLOW.format(operator=operator.username, invoice=json.dumps(SMALL), anchors=tmp_path)
    ran = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DATABASE_URL": role_url(name),
            "DEBUG": "1",
            "SANDBOX_BASE_URL": sandbox,
            "CONNECTOR_TIMEOUT": "0.3",
            "LEDGER_LOOKUP_INTERVAL": "0",
        },
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    shown = json.loads(ran.stdout.strip().splitlines()[-1])
    assert shown["user"] == name
    assert Task.objects.get(pk=shown["rerun"]).state == State.COMPLETED
    assert Effect.objects.filter(system="payments").count() == 1  # paid once: the rerun sent nothing
    assert list(tmp_path.glob("anchor-*.jsonl"))


# --- db_roles run by an owner that is not a superuser -------------------------------------------------


@pytest.fixture(scope="module")
def owned_database(django_db_setup, django_db_blocker):
    """A fresh database owned by a role with CREATEROLE (no superuser), migrated by it, for this module's
    tests (one migrate from empty, seconds, rather than one per test); yields its URL and its owner."""
    suffix = uuid.uuid4().hex[:10]
    owner, dbname = f"owner_{suffix}", f"h_owned_{suffix}"
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE ROLE {owner} LOGIN CREATEROLE")
            cursor.execute(f"CREATE DATABASE {dbname} OWNER {owner}")
        url = database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{owner}@")
        url = url.rsplit("/", 1)[0] + f"/{dbname}"
        migrated = as_owner(url, "migrate", "-v0")
        assert migrated.returncode == 0, migrated.stderr
        made: list[str] = []
        yield url, owner, made
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")
            for role in made:
                cursor.execute(f"DROP ROLE IF EXISTS {role}")
            cursor.execute(f"DROP ROLE {owner}")


@pytest.fixture
def createrole_owner(owned_database, transactional_db):
    """That database, its owner holding CREATEROLE again (a test may take it away); yields its URL and the
    list of app roles to drop at the end."""
    url, owner, made = owned_database
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {owner} CREATEROLE")
    return url, made


def as_owner(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_db_roles_works_for_an_owner_with_createrole_and_no_superuser(createrole_owner):
    url, made = createrole_owner
    app = f"app_{uuid.uuid4().hex[:10]}"
    made.append(app)
    ran = as_owner(url, "db_roles", "--app-role", app)
    assert ran.returncode == 0, ran.stderr
    again = as_owner(url, "db_roles", "--app-role", app)  # idempotent
    assert again.returncode == 0, again.stderr

    dbname = url.rsplit("/", 1)[1]
    db = connection.settings_dict
    with psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, dbname=dbname, user=app
    ) as conn:
        (super_, createrole, createdb) = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert not (super_ or createrole or createdb)
        conn.execute("SELECT count(*) FROM tasks_task").fetchone()
        assert "permission denied" in refused(conn, "UPDATE tasks_task SET input = '{}'")
        assert "permission denied" in refused(conn, "DELETE FROM tenancy_accessevent")
        assert "permission denied" in refused(conn, "CREATE TABLE mine (id int)")


def test_db_roles_names_what_an_owner_without_createrole_lacks(createrole_owner):
    url, _ = createrole_owner
    owner = url.split("//", 1)[1].split("@", 1)[0]
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER ROLE {owner} NOCREATEROLE")
    ran = as_owner(url, "db_roles", "--app-role", f"app_{uuid.uuid4().hex[:10]}")
    assert ran.returncode != 0
    assert f"{owner} has neither CREATEROLE nor SUPERUSER" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_db_roles_names_the_tables_its_caller_does_not_own(transactional_db):
    """Run as a CREATEROLE role against tables another role owns: no GRANT that merely warns."""
    role = f"notowner_{uuid.uuid4().hex[:10]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} LOGIN CREATEROLE")
    try:
        ran = as_owner(role_url(role), "db_roles", "--app-role", f"app_{uuid.uuid4().hex[:10]}")
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP ROLE {role}")
    assert ran.returncode != 0
    assert f"{role} does not own" in ran.stderr and "run db_roles as the role that ran migrate" in ran.stderr
    assert "Traceback" not in ran.stderr


def test_db_roles_in_process_still_refuses_a_superuser_app_role(transactional_db):
    name = f"app_{uuid.uuid4().hex[:10]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {name} SUPERUSER")
    try:
        with pytest.raises(CommandError, match="is a superuser"):
            call_command("db_roles", "--app-role", name)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP ROLE {name}")


# --- start-up without the audit keys ------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["AUDIT_HMAC_KEYS", "AUDIT_ANCHOR_KEY"])
def test_a_production_process_refuses_to_start_without_the_audit_keys(missing):
    env = production_env()
    del env[missing]
    for command in (
        [sys.executable, "manage.py", "check"],
        [sys.executable, "-c", "import config.wsgi"],  # what gunicorn loads
        [sys.executable, "-m", "celery", "-A", "config", "worker", "-P", "solo"],
    ):
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0, command
        assert f"ImproperlyConfigured: {missing} not set" in result.stderr, result.stderr[-2000:]


def test_a_verifying_host_starts_with_only_the_anchor_public_key():
    pair = manage(["audit_anchor", "--generate-key"], production_env(DEBUG="1"))
    assert pair.returncode == 0, pair.stderr
    public = next(line for line in pair.stdout.splitlines() if line.startswith("AUDIT_ANCHOR_PUBLIC_KEYS="))
    env = production_env(AUDIT_ANCHOR_PUBLIC_KEYS=public.split("=", 1)[1])
    del env["AUDIT_ANCHOR_KEY"]
    result = manage(["check"], env)
    assert result.returncode == 0, result.stderr


ADMIN_PAGES = """
import json
from django.test.utils import setup_test_environment
setup_test_environment()
from django.contrib.auth import get_user_model
from django.test import Client
from tenancy.models import Membership
from tests.second_factor import mark_verified

client = Client()
root = get_user_model().objects.get(username="{superuser}")
client.force_login(root)
mark_verified(client, root)  # a superuser gives a second factor too
held = Membership.objects.get(user__username="{approver}")
print(json.dumps({{
    "list": client.get("/admin/tenancy/membership/").status_code,
    "add": client.get("/admin/tenancy/membership/add/").status_code,
    "delete": client.get(f"/admin/tenancy/membership/{{held.pk}}/delete/").status_code,
}}))
"""


def test_the_admins_membership_pages_are_read_only_as_the_app_role(acme, approver, app_role):  # noqa: F811
    """Roles are granted as the owner: connected as the app role the admin shows them, never a 500."""
    name, _ = app_role
    User.objects.create_superuser("root", password="unused-here")  # by the owner, as createsuperuser is
    ran = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", ADMIN_PAGES.format(superuser="root", approver=approver)],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": role_url(name), "DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == {"list": 200, "add": 403, "delete": 403}
