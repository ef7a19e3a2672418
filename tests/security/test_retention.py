"""Retention on a seeded mix: exactly the due tasks are archived or deleted, nothing else is touched.

The mix (``Mix``): two tenants with different policies (acme: its own for every type and one for
``order_lookup``; globex: the defaults), tasks ended long ago, lately and just now, tasks that have
not ended (however old), a task under a legal hold, a failed task whose rerun still runs (kept)
and one whose rerun ended long ago too (both go together). The dry run must list exactly what the
real run then does; rows of every task left alone are compared whole, before and after; deleted
tasks leave tombstones that anchors from before and after accept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from django.core.management import call_command
from django.db import connection
from django.test import Client
from django.utils import timezone

from approvals.models import ApprovalDecision, ApprovalRequest
from audit import sealing
from audit.anchor import write_anchor
from audit.models import Tombstone, TransitionEvent
from ledger.models import Action
from protection import holds, retention
from protection.workers import run_retention
from tasks import checkpoints, services
from tasks.ids import uuid7
from tasks.models import Archive, Checkpoint, ExternalEvent, LegalHold, RetentionPolicy, Task, TaskInput
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tenancy.services import token_create
from tests.audit.owner import delete_task
from tests.audit.test_tamper import app_role, refused, verify_against  # noqa: F401 (app_role: a fixture)
from tests.conftest import api_client_for, make_task, progress
from tests.workflow import ROOT, database_url

pytestmark = pytest.mark.django_db

CARD = "visa-4242-1881"
WORKER = Actor.worker("w")


# --- building the mix ------------------------------------------------------------------------------


def _ago(task: Task, days: float) -> None:
    """Make ``task`` look as if it entered its state ``days`` ago (the task row has no UPDATE guard)."""
    moment = timezone.now() - timedelta(days=days)
    Task.objects.filter(pk=task.pk).update(state_entered_at=moment)


def _evidence(task: Task, approver: Any) -> Task:
    """Rows of every kind a task can own, each with a sealed value: an action, an input answer, an
    external event (one key sealed, one sensitive key in clear), an approval request and decision."""
    task = advance(
        task.id,
        task.state_version,
        State.READY,
        actor=WORKER,
        progress=progress("pay_refund", refund_card=CARD, order_id="A-1"),
        actions=[
            ActionIntent(
                "pay_refund",
                "payments",
                {"kind": "refund", "order_id": "A-1", "amount": "10.00", "card": CARD},
            )
        ],
    )
    now = timezone.now()
    TaskInput.objects.create(
        task=task,
        answered_version=1,
        payload={
            "answer": sealing.seal("my card", sealing.task_place(task.id, "inputs", 1, "payload", "answer"))
        },
        payload_digest="d" * 64,
        submitted_by="acme-operator",
        received_at=now,
    )
    ExternalEvent.objects.create(
        task=task,
        event_key="carrier-1",
        event_type="carrier.update",
        payload={
            "refund_card": sealing.seal(
                CARD, sealing.task_place(task.id, "events", "carrier-1", "payload", "refund_card")
            ),
            "customer_email": "clear@example.com",  # written before sealing: sensitive, in clear
            "status": "delivered",
        },
        received_at=now,
    )
    request_id = uuid7()
    request = ApprovalRequest.objects.create(
        id=request_id,
        task=task,
        tenant=task.tenant,
        step="approve",
        action_step="pay_refund",
        waiting_version=task.state_version,
        consequential={
            "effect": {
                "amount": "10.00",
                "card": sealing.seal(
                    CARD, (*sealing.approval_place(request_id, "consequential"), "effect", "card")
                ),
            }
        },
        digest="a" * 64,
        policy_reason="refunds need approval",
        policy_version="p",
        requested_by="worker:w",
        expires_at=now + timedelta(hours=1),
        created_at=now,
        status="approved",
    )
    ApprovalDecision.objects.create(
        request=request, decision="approve", decided_by=approver, digest_seen="a" * 64, decided_at=now
    )
    return task


def ended(
    tenant: Any,
    state: State,
    days: float,
    *,
    task_type: str = "refund_request",
    rerun_of: Task | None = None,
    approver: Any = None,
) -> Task:
    """A task of ``tenant`` that ended in ``state`` ``days`` ago, with sealed values in its rows."""
    fields: dict[str, Any] = {"task_type": task_type, "rerun_of": rerun_of}
    if task_type == "order_lookup":
        fields["input"] = {"order_id": "A-9"}
    task = make_task(tenant, **fields)
    if approver is not None:
        task = _evidence(task, approver)
    version = task.state_version
    if state == State.COMPLETED:
        outcome = services.seal_outcome(
            task, {"order_id": "A-1", "damaged_item": "a lamp", "payment_ref": "p-1"}
        )
        task = advance(
            task.id,
            version,
            state,
            actor=WORKER,
            progress=progress("done", refund_card=CARD),
            outcome=outcome,
        )
    elif state == State.FAILED:
        task = advance(task.id, version, state, actor=WORKER, progress=progress("failed", refund_card=CARD))
    else:
        task = advance(task.id, version, state, actor=Actor.system("tests"), trigger=Trigger.DEADLINE_PASSED)
    _ago(task, days)
    return Task.objects.get(pk=task.pk)


@dataclass
class Mix:
    tasks: dict[str, Task]
    archive: set[UUID]
    delete: set[UUID]
    untouched: set[UUID]

    def ids(self, *names: str) -> set[UUID]:
        return {self.tasks[name].id for name in names}


@pytest.fixture
def mix(acme, globex, approver, settings) -> Mix:
    settings.RETENTION_ARCHIVE_AFTER_DAYS = 30
    settings.RETENTION_DELETE_AFTER_DAYS = 365
    RetentionPolicy.objects.create(tenant=acme, archive_after_days=10, delete_after_days=100)
    RetentionPolicy.objects.create(
        tenant=acme, task_type="order_lookup", archive_after_days=5, delete_after_days=20
    )
    t: dict[str, Task] = {}
    # acme, every type but order_lookup: archive after 10 days, delete after 100
    t["old"] = ended(acme, State.COMPLETED, 200, approver=approver)
    t["mid"] = ended(acme, State.COMPLETED, 50, approver=approver)
    t["recent"] = ended(acme, State.COMPLETED, 8)
    t["fresh"] = ended(acme, State.EXPIRED, 1)
    running = make_task(acme)
    _ago(running, 900)
    t["running_old"] = running
    t["held"] = ended(acme, State.FAILED, 500, approver=approver)
    holds.set_legal_hold(t["held"], hold=True, by="acme-admin", reason="litigation 2026-17")
    # a failed task whose rerun still runs: kept (the rerun refers to it), archived instead
    t["rerun_base"] = ended(acme, State.FAILED, 300)
    t["rerun_live"] = make_task(acme, rerun_of=t["rerun_base"])
    _ago(t["rerun_live"], 300)
    # a failed task whose rerun ended long ago too: both go, together
    t["pair_first"] = ended(acme, State.FAILED, 300)
    t["pair_second"] = ended(acme, State.COMPLETED, 150, rerun_of=t["pair_first"])
    # acme order_lookup, its own policy: archive after 5 days, delete after 20
    t["lookup_25"] = ended(acme, State.COMPLETED, 25, task_type="order_lookup")
    t["lookup_8"] = ended(acme, State.EXPIRED, 8, task_type="order_lookup")
    t["lookup_2"] = ended(acme, State.COMPLETED, 2, task_type="order_lookup")
    # globex: the defaults, archive after 30 days, delete after 365
    t["g_old"] = ended(globex, State.COMPLETED, 400)
    t["g_mid"] = ended(globex, State.FAILED, 100, approver=approver)
    t["g_recent"] = ended(globex, State.COMPLETED, 20)
    every = {task.id for task in t.values()}
    m = Mix(t, set(), set(), set())
    m.archive = m.ids("mid", "rerun_base", "lookup_8", "g_mid")
    m.delete = m.ids("old", "pair_first", "pair_second", "lookup_25", "g_old")
    m.untouched = every - m.archive - m.delete
    return m


def rows_of(ids: set[UUID]) -> dict[str, list[dict[str, Any]]]:
    """Every row of these tasks: the task rows and each row any table holds for them, whole."""
    found = {"task": list(Task.objects.filter(pk__in=ids).order_by("pk").values())}
    for dependent in retention.dependents():
        rows = dependent.model._base_manager.filter(**{f"{dependent.to_task}__in": ids}).order_by("pk")
        found[f"{dependent.model._meta.label} by {dependent.to_task}"] = list(rows.values())
    return found


def listed(out: str) -> dict[str, set[UUID]]:
    chosen: dict[str, set[UUID]] = {"archive": set(), "delete": set()}
    for line in out.splitlines():
        words = line.split()
        if words and words[0] in chosen:
            chosen[words[0]].add(UUID(words[1]))
    return chosen


def command(*args: str, capsys: Any) -> tuple[str, str]:
    call_command("retention", *args)
    captured = capsys.readouterr()
    return captured.out, captured.err


# --- policies ------------------------------------------------------------------------------------------


def test_the_most_specific_policy_wins_and_zero_means_never(acme, globex, settings):
    settings.RETENTION_ARCHIVE_AFTER_DAYS, settings.RETENTION_DELETE_AFTER_DAYS = 30, 0
    RetentionPolicy.objects.create(tenant=acme, archive_after_days=10, delete_after_days=100)
    RetentionPolicy.objects.create(
        tenant=acme, task_type="order_lookup", archive_after_days=None, delete_after_days=20
    )
    acme_rules, globex_rules = retention.TenantRules(acme), retention.TenantRules(globex)
    assert (acme_rules.rule("order_lookup").archive_after, acme_rules.rule("order_lookup").delete_after) == (
        None,
        20,
    )
    assert (
        acme_rules.rule("refund_request").archive_after,
        acme_rules.rule("refund_request").delete_after,
    ) == (10, 100)
    assert (
        globex_rules.rule("refund_request").archive_after,
        globex_rules.rule("refund_request").delete_after,
    ) == (30, None)
    assert "policy acme/order_lookup" in acme_rules.rule("order_lookup").describe()


# --- the dry run and the real run --------------------------------------------------------------------


def test_the_dry_run_lists_exactly_the_due_tasks_and_changes_nothing(mix, capsys):
    every = mix.archive | mix.delete | mix.untouched
    before = rows_of(every)

    out, _ = command("--dry-run", "--list", "--batch-size", "2", capsys=capsys)

    chosen = listed(out)
    assert chosen["archive"] == mix.archive
    assert chosen["delete"] == mix.delete
    assert sum(line.startswith(("archive ", "delete ")) for line in out.splitlines()) == 9, "each task once"
    assert rows_of(every) == before and not Tombstone.objects.exists()
    assert "total: 4 to archive, 5 to delete (1 held, 1 kept for a task that stays)" in out


def test_the_counts_are_per_tenant_and_task_type(mix):
    report = retention.run(dry_run=True, batch_size=3)
    counts = {key: (t.archive, t.delete, t.held, t.kept) for key, t in report.tallies.items()}
    assert counts == {
        ("acme", "refund_request"): (2, 3, 1, 1),
        ("acme", "order_lookup"): (1, 1, 0, 0),
        ("globex", "refund_request"): (1, 1, 0, 0),
    }
    only_globex = retention.run(dry_run=True, tenant="globex")
    assert set(only_globex.tallies) == {("globex", "refund_request")}


def test_the_real_run_does_what_the_dry_run_listed_and_touches_nothing_else(mix, capsys):
    untouched_before = rows_of(mix.untouched)
    dry, _ = command("--dry-run", "--list", "--batch-size", "2", capsys=capsys)

    out, err = command("--list", "--batch-size", "2", capsys=capsys)

    assert listed(out) == listed(dry)
    assert "total: 4 archived, 5 deleted" in out
    assert "batch" in err  # progress per batch
    assert rows_of(mix.untouched) == untouched_before, "a task that was not due changed"
    assert not Task.objects.filter(pk__in=mix.delete).exists()
    assert all(rows == [] for rows in rows_of(mix.delete).values()), "a deleted task left rows behind"
    assert set(Archive.objects.values_list("task_id", flat=True)) == mix.archive
    stones = {stone.task_id: stone for stone in Tombstone.objects.all()}
    assert set(stones) == mix.delete
    first = stones[mix.tasks["pair_first"].id]
    assert (first.tenant_id, first.task_type) == (mix.tasks["pair_first"].tenant_id, "refund_request")
    assert first.reason.startswith("retention: failed since")
    # idempotent: nothing is left to do
    again, _ = command("--list", capsys=capsys)
    assert listed(again) == {"archive": set(), "delete": set()} and "total: 0 archived, 0 deleted" in again


def test_archiving_erases_sealed_values_and_keeps_the_evidence(mix, capsys, auditor):
    task = mix.tasks["mid"]
    points = {p.state_version: p for p in Checkpoint.objects.filter(task=task)}
    actions = list(
        Action.objects.filter(task=task).values(
            "idempotency_key", "dispatch_state", "effect_digest", "outcome"
        )
    )
    decision = ApprovalDecision.objects.filter(request__task=task).values().get()
    assert CARD not in json.dumps(task.input) and sealing.key_ids(task.input)  # sealed before

    command(capsys=capsys)

    archived = Task.objects.get(pk=task.pk)
    erased = sealing.ERASED
    assert archived.state == State.COMPLETED and archived.state_version == task.state_version
    assert archived.input["customer_email"] == {"$sealed": erased, "t": ""}
    assert archived.input["order_id"] == "A-1"
    assert archived.outcome["damaged_item"] == {"$sealed": erased, "t": ""}
    assert archived.outcome["payment_ref"] == "p-1"
    for version, before in points.items():
        after = Checkpoint.objects.get(pk=before.pk)
        assert after.digest == before.digest and checkpoints.digest(after.body) == before.digest
        assert set(sealing.key_ids_in_text(after.body)) <= {erased}
        recorded = TransitionEvent.objects.get(task=task, state_version=version).checkpoint_digest
        document = retention.read_archived(after, recorded_digest=recorded)  # still loads, verified
        if "refund_card" in document.facts:
            assert document.facts["refund_card"] == "[erased]"
    # The task's history stays readable to reviewers: the API shows every archived checkpoint.
    answer = api_client_for(auditor).get(f"/api/tasks/{task.id}/checkpoints/").json()
    shown = answer.get("results", answer)
    assert isinstance(shown, list) and shown and all(item["readable"] for item in shown), answer
    action = Action.objects.get(task=task)
    assert action.effect["card"] == {"$sealed": erased, "t": ""} and action.effect["amount"] == "10.00"
    assert (
        list(
            Action.objects.filter(task=task).values(
                "idempotency_key", "dispatch_state", "effect_digest", "outcome"
            )
        )
        == actions
    )
    assert ApprovalDecision.objects.filter(request__task=task).values().get() == decision
    request = ApprovalRequest.objects.get(task=task)
    assert request.consequential["effect"]["card"] == {"$sealed": erased, "t": ""}
    event = ExternalEvent.objects.get(task=task)
    assert event.payload == {
        "refund_card": {"$sealed": erased, "t": ""},
        "customer_email": {"$sealed": erased, "t": ""},
        "status": "delivered",
    }
    assert TaskInput.objects.get(task=task).payload == {"answer": {"$sealed": erased, "t": ""}}
    record = Archive.objects.get(task=task)
    assert record.erased >= 8 and "policy acme/*" in record.rule
    call_command("verify_audit")  # every chain, archived ones included, still verifies
    assert "OK" in capsys.readouterr().out


def test_a_kept_task_is_archived_and_goes_once_its_rerun_has_gone(mix, capsys):
    command(capsys=capsys)
    base, live = mix.tasks["rerun_base"], mix.tasks["rerun_live"]
    assert Task.objects.filter(pk=base.pk).exists() and Archive.objects.filter(task=base).exists()
    assert Task.objects.get(pk=live.pk).state == State.READY
    finished = advance(live.id, live.state_version, State.COMPLETED, actor=WORKER)
    _ago(finished, 200)

    out, _ = command("--list", capsys=capsys)

    assert listed(out)["delete"] == {base.id, live.id}
    assert not Task.objects.filter(pk__in=[base.id, live.id]).exists()


# --- what is never touched ----------------------------------------------------------------------------


def test_a_batch_holding_a_task_that_has_not_ended_is_refused_whole(mix):
    rules = retention.TenantRules(mix.tasks["old"].tenant)
    ids = [mix.tasks["old"].id, mix.tasks["running_old"].id]
    before = rows_of(set(ids))
    now = timezone.now()
    with pytest.raises(retention.RetentionRefused, match="has not ended"):
        retention.delete_tasks(ids, rules, now)
    with pytest.raises(retention.RetentionRefused, match="has not ended"):
        retention.archive_tasks(ids, rules, now)
    assert rows_of(set(ids)) == before and not Tombstone.objects.exists()


def test_a_hold_placed_after_the_plan_is_respected_by_the_run(mix, admin_user):
    task = mix.tasks["old"]
    rules = retention.TenantRules(task.tenant)
    holds.set_legal_hold(task, hold=True, by="acme-admin", reason="subpoena")
    assert retention.delete_tasks([task.id], rules, timezone.now()) == 0
    assert retention.archive_tasks([task.id], rules, timezone.now()) == 0
    assert Task.objects.filter(pk=task.pk).exists() and not Archive.objects.filter(task=task).exists()


def test_lifting_the_hold_lets_retention_take_the_task(mix, capsys):
    held = mix.tasks["held"]
    assert holds.set_legal_hold(held, hold=False, by="acme-admin", reason="case closed")
    out, _ = command("--dry-run", "--list", capsys=capsys)
    assert held.id in listed(out)["delete"]
    hold = LegalHold.objects.get(task=held)
    assert (hold.placed_by, hold.lifted_by, hold.lift_reason) == ("acme-admin", "acme-admin", "case closed")


# --- tombstones and anchors --------------------------------------------------------------------------


def test_anchors_before_and_after_the_deletion_verify_and_a_hand_deletion_is_reported(mix, tmp_path, capsys):
    before = write_anchor(tmp_path / "before").path
    command(capsys=capsys)
    after = write_anchor(tmp_path / "after").path
    assert sum(1 for line in after.read_text().splitlines() if '"tombstone"' in line) == len(mix.delete)

    for anchor in (before, after):
        ok, out, err = verify_against(anchor, capsys)
        assert ok, err
        assert "OK" in out

    victim = mix.tasks["g_recent"]  # deleted by hand as the owner, around every guard, no tombstone
    delete_task(victim)
    ok, _, err = verify_against(after, capsys)
    assert not ok
    assert f"task {victim.id} v2 (tenant {victim.tenant_id}): anchored, now deleted, and no tombstone" in err
    assert str(mix.tasks["old"].id) not in err  # the retained deletion is accounted for


# --- the roles -------------------------------------------------------------------------------------------


def test_the_app_role_cannot_delete_and_its_run_leaves_archives_and_deletions_to_the_owner(
    acme,
    app_role,  # noqa: F811
):
    name, connect = app_role
    RetentionPolicy.objects.create(tenant=acme, archive_after_days=10, delete_after_days=100)
    old = ended(acme, State.COMPLETED, 200)
    conn = connect()
    with conn.transaction():  # the retention switch alone gives the app role nothing
        conn.execute("SET LOCAL audit.retention = 'on'")
        for table, column in (
            ("tasks_checkpoint", "task_id"),
            ("audit_transitionevent", "task_id"),
            ("tasks_task", "id"),
        ):
            problem = refused(
                conn, f"DELETE FROM {table} WHERE {column} = %s", [old.id]
            )  # by privilege or trigger
            assert "append-only" in problem or "permission denied" in problem

    url = database_url().replace(f"//{connection.settings_dict['USER']}@", f"//{name}@")
    ran = subprocess.run(
        [sys.executable, "manage.py", "retention", "--list"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "DEBUG": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert ran.returncode == 0, ran.stderr
    # Archiving erases the task's input and approval copies, which the app role may not update (db_roles).
    assert listed(ran.stdout) == {"archive": set(), "delete": set()}
    assert "1 tasks due for archiving or deletion are left: this connection is not the owner" in ran.stderr
    assert Task.objects.filter(pk=old.pk).exists() and not Archive.objects.filter(task=old).exists()
    assert not Tombstone.objects.exists()


def test_beat_runs_the_same_function(mix):
    assert run_retention() == "4 archived, 5 deleted, 0 awaiting the owner"
    assert not Task.objects.filter(pk__in=mix.delete).exists()


# --- placing and lifting a hold --------------------------------------------------------------------------


def test_an_admin_places_and_lifts_a_hold_through_the_api(acme, admin_user):
    task = ended(acme, State.COMPLETED, 1)
    client = api_client_for(admin_user)
    url = f"/api/tasks/{task.id}/legal-hold/"

    placed = client.post(url, {"hold": True, "reason": "litigation"}, format="json")
    again = client.post(url, {"hold": True, "reason": "again"}, format="json")

    assert placed.status_code == 200 and placed.json()["changed"] is True
    assert placed.json()["status"]["legal_hold"] is True
    assert again.status_code == 200 and again.json()["changed"] is False
    lifted = client.post(url, {"hold": False, "reason": "settled"}, format="json").json()
    assert lifted["changed"] is True and lifted["status"]["legal_hold"] is False
    (hold,) = client.get(url).json()["holds"]
    assert (hold["placed_by"], hold["reason"], hold["lifted_by"], hold["lift_reason"]) == (
        "acme-admin",
        "litigation",
        "acme-admin",
        "settled",
    )


def test_only_the_tenants_admins_may_hold_and_bad_input_is_a_400(
    acme, operator, auditor, outsider, admin_user
):
    task = ended(acme, State.COMPLETED, 1)
    url = f"/api/tasks/{task.id}/legal-hold/"
    body = {"hold": True, "reason": "because"}
    assert api_client_for(operator).post(url, body, format="json").status_code == 403
    assert api_client_for(auditor).post(url, body, format="json").status_code == 403
    assert api_client_for(outsider).post(url, body, format="json").status_code == 404
    assert api_client_for(auditor).get(url).status_code == 200
    admin = api_client_for(admin_user)
    assert admin.post(url, {"hold": True}, format="json").status_code == 400
    assert admin.post(url, {"hold": "maybe", "reason": "x"}, format="json").status_code == 400
    assert admin.post(url, {"hold": True, "reason": "a\u0000b"}, format="json").status_code == 400
    _, key = token_create(admin_user, scopes=["read"], expires_at=None)
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").post(url, body, "application/json").status_code == 403
    _, key = token_create(admin_user, scopes=["operate"], expires_at=None)
    assert Client(HTTP_AUTHORIZATION=f"Token {key}").post(url, body, "application/json").status_code == 200
    assert not LegalHold.objects.exclude(placed_by="acme-admin").exists()


def test_an_admin_places_a_hold_from_the_task_page(acme, admin_user, operator):
    task = ended(acme, State.COMPLETED, 1)
    admin = Client()
    admin.force_login(admin_user)
    page = admin.get(f"/console/tasks/{task.id}/").content.decode()
    assert "Place legal hold" in page

    response = admin.post(
        f"/console/tasks/{task.id}/legal-hold/", {"hold": "place", "reason": "audit <b>2026</b>"}
    )

    assert response.status_code == 302
    page = admin.get(f"/console/tasks/{task.id}/").content.decode()
    assert (
        "Legal hold in force" in page
        and "audit &lt;b&gt;2026&lt;/b&gt;" in page
        and "Lift legal hold" in page
    )
    other = Client()
    other.force_login(operator)
    assert "Place legal hold" not in other.get(f"/console/tasks/{task.id}/").content.decode()
    assert (
        other.post(f"/console/tasks/{task.id}/legal-hold/", {"hold": "lift", "reason": "x"}).status_code
        == 403
    )
    assert LegalHold.objects.get(task=task).lifted_at is None
