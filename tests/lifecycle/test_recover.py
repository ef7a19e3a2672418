"""After a restore, ``manage.py recover`` finds the payments our database forgot (issue 21, item 2).

Before: tasks paid their invoices, then our database was restored from a backup taken before
they existed. The payment system kept the payments; nothing in the product could find them (the
reconciler works from ledger rows, and there were none). Now ``recover`` asks the payment system,
over live HTTP, what it holds in the window at risk and names exactly the payments no ledger row
explains; ``--apply`` records them for operators, once, with the restore; and a client that
re-submits with the same idempotency key gets its first payment back and settles the orphan.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from audit.anchor import write_anchor
from audit.keys import encode_private
from audit.models import AnchorRequest
from config import metrics as metrics_config
from demo.sandbox.models import Effect
from ledger.models import Action, OrphanEffect, OrphanStatus, RestoreRecord
from runtime import alerts
from runtime.models import Alert, AlertKind
from tasks.models import Task
from tasks.states import State
from tests.conftest import api_client_for
from tests.ledger import restore
from tests.ledger.restore import forget
from tests.observability.test_metrics import scrape, value
from tests.runtime.payments import run
from tests.workflow import ROOT, database_url

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings, tmp_path):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.AUDIT_ANCHOR_DIR = tmp_path / "anchors"


def body(invoice: str, client_key: str | None = None) -> dict:
    sent = {
        "task_type": "pay_invoice",
        "objective": f"Pay {invoice}",
        "input": {"invoice_id": invoice, "amount": "400.00", "currency": "EUR"},
    }
    return {**sent, "idempotency_key": client_key} if client_key else sent


def paid(operator, invoice: str, client_key: str | None = "") -> Task:
    """A task created over the API with a client key (``client-<invoice>`` unless given), run to the end."""
    sent = body(invoice, f"client-{invoice}" if client_key == "" else client_key)
    response = api_client_for(operator).post("/api/tasks/", json.dumps(sent), content_type="application/json")
    assert response.status_code == 201, response.content
    task = run(Task.objects.get(pk=response.json()["id"]))
    assert task.state == State.COMPLETED
    return task


def key_of(invoice: str) -> str:
    [effect] = [e for e in Effect.objects.filter(system="payments") if e.request.get("invoice") == invoice]
    return effect.idempotency_key


def recover(*, since=None, apply: bool = False) -> str:
    out = StringIO()
    options = {"since": since.isoformat()} if since else {}
    call_command("recover", apply=apply, stdout=out, **options)
    return out.getvalue()


def orphan_keys(output: str) -> set[str]:
    return {line.split()[2] for line in output.splitlines() if line.startswith("ORPHAN ")}


@pytest.fixture
def restored(operator, acme, tmp_path):
    """INV-1 paid before the backup; INV-2 and INV-3 paid after it; the backup restored. Returns the
    time before the first task, and the keys of the lost payments."""
    start = timezone.now()
    paid(operator, "INV-1")
    backup = restore.dump(tmp_path / "backup.dump")
    paid(operator, "INV-2")
    paid(operator, "INV-3")
    restore.restore(backup)
    assert Task.objects.count() == 1
    return start, {key_of("INV-2"), key_of("INV-3")}


def test_a_dry_run_lists_exactly_the_payments_the_restore_lost(restored, acme):
    since, lost = restored
    output = recover(since=since)
    assert orphan_keys(output) == lost  # INV-1 was paid too, and its action explains it
    assert key_of("INV-1") not in output
    assert all(f"tenant={acme.pk}" in line for line in output.splitlines() if line.startswith("ORPHAN"))
    assert "2 orphan effect(s) of 3 listed; dry run, nothing recorded" in output
    assert not OrphanEffect.objects.exists() and not RestoreRecord.objects.exists()


def test_apply_records_each_orphan_once_however_often_it_runs(restored, acme):
    since, lost = restored
    recover(since=since, apply=True)
    again = recover(since=since, apply=True)
    assert "recorded 0 new" in again
    rows = OrphanEffect.objects.all()
    assert {r.idempotency_key for r in rows} == lost and len(rows) == 2
    assert all(r.tenant_id == acme.pk and r.status == OrphanStatus.OPEN for r in rows)
    paid_record = Effect.objects.get(idempotency_key=rows[0].idempotency_key)
    assert rows[0].record_id == str(paid_record.pk) and rows[0].system_status == "succeeded"


def test_apply_writes_the_restore_per_tenant_and_rings_for_a_fresh_anchor(restored, acme):
    since, _ = restored
    recover(since=since, apply=True)
    [note] = RestoreRecord.objects.filter(tenant=acme)
    assert (note.since, note.orphans, note.recorded) == (since, 2, 2)
    assert AnchorRequest.objects.filter(reason="restored").count() == 1


def test_a_resubmitted_create_pays_nothing_more_and_settles_its_orphan(restored, operator):
    since, _ = restored
    recover(since=since, apply=True)
    again = paid(operator, "INV-2")  # the client retries with the same body and idempotency key
    [payment] = [e for e in Effect.objects.filter(system="payments") if e.request.get("invoice") == "INV-2"]
    assert payment.deliveries == 2 and again.outcome["payment_ref"] == str(payment.pk)  # paid once
    settled = OrphanEffect.objects.get(idempotency_key=payment.idempotency_key)
    assert (settled.status, settled.settled_task) == (OrphanStatus.SETTLED, again.id)
    assert OrphanEffect.objects.get(idempotency_key=key_of("INV-3")).status == OrphanStatus.OPEN


def test_an_orphan_explained_by_the_next_run_is_settled_by_it(restored, operator, monkeypatch):
    """A task re-created with the client's key before recover recorded its orphan: the next run settles it."""
    since, _ = restored
    recover(since=since, apply=True)
    monkeypatch.setattr("ledger.orphans.settle", lambda *args: None)  # as if the engine's settle were missed
    again = paid(operator, "INV-3")
    monkeypatch.undo()
    assert OrphanEffect.objects.get(idempotency_key=key_of("INV-3")).status == OrphanStatus.OPEN
    output = recover(since=since, apply=True)
    assert "1 settled by re-created tasks" in output and orphan_keys(output) == {key_of("INV-2")}
    assert OrphanEffect.objects.get(idempotency_key=key_of("INV-3")).settled_task == again.id


def test_a_window_without_orphans_says_so(operator, acme):
    since = timezone.now()
    paid(operator, "INV-1")
    output = recover(since=since)
    assert orphan_keys(output) == set()
    assert "no orphan effects (1 effect(s) listed, every one explained)" in output


def test_an_orphan_whose_key_names_no_tenant_is_listed_without_one(operator, acme):
    since = timezone.now()
    lost = paid(operator, "INV-9", client_key=None)  # no client key: the task-id key scheme
    forget([lost.id])
    [line] = [line for line in recover(since=since).splitlines() if line.startswith("ORPHAN")]
    assert f" {lost.id}:pay:" in line and "tenant=-" in line


def test_without_since_the_window_starts_at_the_newest_anchor(operator, acme, settings):
    old = paid(operator, "INV-OLD")  # lost long before the window: not this restore's
    forget([old.id])
    Effect.objects.update(created_at=timezone.now() - timedelta(hours=2))
    paid(operator, "INV-1")
    write_anchor(settings.AUDIT_ANCHOR_DIR)
    lost = paid(operator, "INV-2")
    forget([lost.id])
    assert not Action.objects.filter(task=lost).exists()
    assert orphan_keys(recover()) == {key_of("INV-2")}


def test_without_since_and_without_an_anchor_recover_refuses(acme):
    with pytest.raises(CommandError, match="no anchor.*--since"):
        recover()


def test_a_since_without_an_offset_is_refused(acme):
    with pytest.raises(CommandError, match="UTC offset"):
        call_command("recover", since="2026-12-01T09:00:00", stdout=StringIO())


def test_a_payment_system_that_does_not_answer_fails_the_run(acme, settings):
    settings.SANDBOX_BASE_URL = "http://127.0.0.1:9/sandbox"
    with pytest.raises(CommandError, match="not searched in full"):
        recover(since=timezone.now())


def test_open_orphans_raise_one_alert_for_their_tenant_until_they_are_settled(restored, operator, acme):
    since, _ = restored
    recover(since=since, apply=True)
    alerts.scan()
    alerts.scan()  # raised once
    [alert] = Alert.objects.filter(kind=AlertKind.ORPHAN_EFFECTS_OPEN, cleared_at__isnull=True)
    assert (alert.tenant_id, alert.task_id) == (acme.pk, None) and alert.cause.startswith("2 effect(s)")
    paid(operator, "INV-2")
    alerts.scan()
    assert Alert.objects.filter(kind=AlertKind.ORPHAN_EFFECTS_OPEN, cleared_at__isnull=True).count() == 1
    paid(operator, "INV-3")  # the last open orphan settled
    alerts.scan()
    alert.refresh_from_db()
    assert alert.cleared_at is not None


def test_the_open_orphan_alert_shows_on_metrics(restored, client, settings):
    settings.METRICS_CACHE_SECONDS, settings.METRICS_TOKEN = 0, ""
    settings.METRICS_ALLOW_IPS = ["127.0.0.1/32"]
    assert metrics_config.configure()
    since, _ = restored
    recover(since=since, apply=True)
    alerts.scan()
    assert value(scrape(client), "durable_alerts_open", kind=AlertKind.ORPHAN_EFFECTS_OPEN.value) == 1


def test_every_lost_create_resubmitted_completes_on_its_orphan_and_nothing_is_paid_twice(restored, operator):
    since, lost = restored
    recover(since=since, apply=True)
    again = [paid(operator, "INV-2"), paid(operator, "INV-3")]
    payments = Effect.objects.filter(system="payments")
    assert payments.count() == 3  # INV-1, INV-2, INV-3: once each
    assert {e.idempotency_key: e.deliveries for e in payments if e.idempotency_key in lost} == dict.fromkeys(
        lost, 2
    )
    settled = OrphanEffect.objects.filter(status=OrphanStatus.SETTLED)
    assert {o.idempotency_key for o in settled} == lost and {o.settled_task for o in settled} == {
        t.id for t in again
    }
    assert "no orphan effects" in recover(since=since)  # explained now


# --- A documented restore, told from tampering (issue 21, item 2) ---------------------------------


def created(operator, invoice: str) -> Task:
    """A task created over the API with a client key and not run yet (``ready``, v1)."""
    sent = body(invoice, f"client-{invoice}")
    response = api_client_for(operator).post("/api/tasks/", json.dumps(sent), content_type="application/json")
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


def verify(*options: str) -> tuple[bool, str, str]:
    """``verify_audit`` with ``options``: whether it passed, its stdout, its stderr (and error)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("verify_audit", *options, stdout=out, stderr=err)
        ok = True
    except CommandError as exc:
        ok = False
        err.write(str(exc))
    return ok, out.getvalue(), err.getvalue()


def past_the_guards(sql: str, params: list) -> None:
    """What a database owner can do by hand: a statement no trigger stops."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        try:
            cursor.execute(sql, params)
        finally:
            cursor.execute("SET session_replication_role = DEFAULT")


@pytest.fixture
def anchored_restore(operator, acme, tmp_path, settings):
    """INV-1 paid and INV-4 created before the backup; after it INV-2 and INV-3 paid, INV-4 run and
    paid; an anchor written; the backup restored. Returns the anchor, the lost tasks' ids, the orphans'
    keys and INV-4 (set back to v1)."""
    paid(operator, "INV-1")
    later = created(operator, "INV-4")
    backup = restore.dump(tmp_path / "backup.dump")
    lost = {paid(operator, "INV-2").id, paid(operator, "INV-3").id}
    assert run(Task.objects.get(pk=later.pk)).state == State.COMPLETED
    anchor = write_anchor(settings.AUDIT_ANCHOR_DIR).path
    restore.restore(backup)
    assert Task.objects.get(pk=later.pk).state_version == 1
    return anchor, lost, {key_of("INV-2"), key_of("INV-3"), key_of("INV-4")}, later


def test_after_recover_verify_against_the_pre_restore_anchor_reports_a_documented_restore(
    anchored_restore, acme
):
    anchor, lost, orphaned, set_back = anchored_restore
    ok, _, err = verify("--against", str(anchor))
    assert not ok and all(str(task_id) in err for task_id in lost)  # before recover: unexplained

    dry = recover()  # the window from the anchor: nothing to pass
    assert orphan_keys(dry) == orphaned  # INV-1's payment is explained by its action, and not listed
    assert {line.split()[1] for line in dry.splitlines() if line.startswith("LOST ")} == {
        *map(str, lost),
        str(set_back.id),
    }
    assert f"LOST {set_back.id} tenant={acme.pk} anchored=v" in dry and " now=v1" in dry
    assert not OrphanEffect.objects.exists() and not RestoreRecord.objects.exists()

    recover(apply=True)
    assert {o.idempotency_key for o in OrphanEffect.objects.all()} == orphaned
    [record] = RestoreRecord.objects.filter(tenant=acme)
    assert (record.orphans, record.tasks_lost, record.tasks_behind, record.anchor) == (3, 2, 1, anchor.name)
    assert {loss.task_id for loss in record.losses.all()} == {*lost, set_back.id}

    ok, out, err = verify("--against", str(anchor))
    assert ok, err
    assert f"documented restore: {record.at.isoformat()}, window since {record.since.isoformat()}" in out
    assert "2 tasks lost, 1 set back, 3 orphans found" in out
    assert "but for" in out and "a documented restore explains" in out
    assert verify()[0]  # the restore chain verifies on its own too


def test_the_verify_audit_process_fails_before_recover_and_exits_0_on_the_documented_restore(
    anchored_restore,
):
    """The exit code a monitor reads, from the command as operators run it (its own process)."""
    anchor, lost, _, _ = anchored_restore

    def verify_process() -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "DATABASE_URL": database_url(), "DEBUG": "1"}
        command = [sys.executable, "manage.py", "verify_audit", "--against", str(anchor)]
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    before = verify_process()
    assert before.returncode == 1 and all(str(task_id) in before.stderr for task_id in lost)
    recover(apply=True)
    after = verify_process()
    assert after.returncode == 0, after.stderr
    assert (
        "documented restore:" in after.stdout and "2 tasks lost, 1 set back, 3 orphans found" in after.stdout
    )


def test_work_redone_after_a_documented_restore_still_verifies_against_the_old_anchor(
    anchored_restore, operator
):
    """The set-back task runs again (new events at the anchored versions) and a lost create is
    re-submitted: the anchor's heads differ now, and the restore record explains exactly that."""
    anchor, _, _, set_back = anchored_restore
    recover(apply=True)
    assert run(Task.objects.get(pk=set_back.pk)).state == State.COMPLETED
    paid(operator, "INV-2")
    ok, out, err = verify("--against", str(anchor))
    assert ok, err
    assert "documented restore:" in out


def test_deleting_a_restore_record_fails_verify_audit(anchored_restore):
    anchor, *_ = anchored_restore
    recover(apply=True)
    newest = RestoreRecord.objects.order_by("-id").first()
    past_the_guards("DELETE FROM ledger_restorerecord WHERE id = %s", [newest.pk])
    ok, _, err = verify()
    assert not ok and "restore chain's head does not match" in err


def test_deleting_the_lost_tasks_restore_record_fails_verify_against_the_anchor(anchored_restore, acme):
    anchor, lost, _, _ = anchored_restore
    recover(apply=True)
    record = RestoreRecord.objects.get(tenant=acme)
    past_the_guards("DELETE FROM ledger_restoreloss WHERE record_id = %s", [record.pk])
    past_the_guards("DELETE FROM ledger_restorerecord WHERE id = %s", [record.pk])
    ok, out, err = verify("--against", str(anchor))
    assert not ok and "documented restore" not in out
    assert "problems in the restore chain" in err and all(str(task_id) in err for task_id in lost)


def test_editing_a_restore_record_fails_verify_audit(anchored_restore, acme):
    recover(apply=True)
    record = RestoreRecord.objects.get(tenant=acme)
    past_the_guards("UPDATE ledger_restorerecord SET orphans = 0 WHERE id = %s", [record.pk])
    ok, _, err = verify()
    assert not ok and f"restore record #{record.pk}" in err and "contents do not match the stored hash" in err


def test_editing_what_a_restore_record_names_as_lost_fails_verify_audit(anchored_restore, acme):
    recover(apply=True)
    record = RestoreRecord.objects.get(tenant=acme)
    loss = record.losses.first()
    past_the_guards("DELETE FROM ledger_restoreloss WHERE id = %s", [loss.pk])
    ok, _, err = verify()
    assert not ok and "the tasks it names as lost differ" in err


def test_a_restore_record_signed_with_another_key_fails_and_excuses_nothing(anchored_restore, settings):
    """A chain-key holder who deleted tasks cannot document them as a restore: the record must carry the
    signature of a trusted anchor key, which the application never holds."""
    anchor, lost, _, _ = anchored_restore
    trusted = settings.AUDIT_ANCHOR_KEY
    settings.AUDIT_ANCHOR_KEY = encode_private(Ed25519PrivateKey.generate())
    recover(apply=True)  # written with the right chain key and the forger's own "anchor key"
    settings.AUDIT_ANCHOR_KEY = trusted
    ok, out, err = verify("--against", str(anchor))
    assert not ok and "documented restore" not in out
    assert "which is not a trusted anchor key" in err and all(str(task_id) in err for task_id in lost)


def test_a_task_chain_tampered_with_after_a_documented_restore_still_fails_against_the_anchor(
    anchored_restore,
):
    anchor, _, _, set_back = anchored_restore
    recover(apply=True)
    past_the_guards(
        "UPDATE audit_transitionevent SET reason = 'nothing to see' WHERE task_id = %s AND state_version = 1",
        [set_back.pk],
    )
    ok, out, err = verify("--against", str(anchor))
    assert not ok and "documented restore:" in out  # the restore is still read as one ...
    assert f"task {set_back.id} v1: contents do not match the stored hash" in err  # ... the edit is not


def test_a_task_deleted_after_a_documented_restore_is_not_excused_by_it(anchored_restore, operator):
    anchor, *_ = anchored_restore
    recover(apply=True)
    kept = Task.objects.get(objective="Pay INV-1")
    forget([kept.id])
    ok, _, err = verify("--against", str(anchor))
    assert not ok and f"task {kept.id} v" in err and "anchored, now deleted, and no tombstone" in err


def test_a_window_starting_after_the_restore_point_documents_no_restore(anchored_restore):
    anchor, lost, _, _ = anchored_restore
    output = recover(since=timezone.now(), apply=True)
    assert "WARNING the window starts after the restored database's newest transition" in output
    ok, out, err = verify("--against", str(anchor))
    assert not ok and "documented restore" not in out and all(str(task_id) in err for task_id in lost)
