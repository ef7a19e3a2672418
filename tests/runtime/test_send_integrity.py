"""An effect is sent only as it was intended (and approved): the attack of issue 20, as tests.

With only the app role's database access, one SQL ``UPDATE`` of a queued action's
``effect`` once made the worker pay 99,999.00 instead of 77.00. Each test here
tampers with a real task's rows by SQL, then runs the real worker path that sends
(``runtime.runner`` -> ``runtime.engine`` -> ``runtime.dispatch``) against the live
sandbox over HTTP, and counts what reached the payments system.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from approvals import services as approval_services
from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger import integrity
from ledger.models import Action, DispatchState
from runtime import controls, dispatch, runner
from runtime.models import Alert, AlertKind
from tasks import checkpoints
from tasks.models import Checkpoint, Task
from tasks.states import State
from tests.audit.owner import triggers_off
from tests.conftest import api_client_for
from tests.runtime.payments import fault, invoice_task, payments, run
from tests.workflow import approve

pytestmark = pytest.mark.django_db(transaction=True)

ALTERED = '"99999.00"'


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2


def intend(task: Task) -> Action:
    """Run the worker until the payment's intent is committed, and stop before it is sent."""
    outcome = runner.run_task(
        task.id,
        worker_id="test-worker",
        region="default",
        stopping=lambda: Action.objects.filter(task_id=task.id).exists(),
    )
    assert outcome == "draining"
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.INTENDED
    return action


def sql(statement: str, *params: object) -> None:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def alter_effect(action: Action, *, with_digest: bool = False) -> None:
    """What the app role can do: rewrite the queued effect. ``with_digest``: and, as only the owner
    can (around the trigger that freezes an intent, ledger migration 0004), its row digest to match."""
    sql(
        f"UPDATE ledger_action SET effect = jsonb_set(effect, '{{amount}}', '{ALTERED}') WHERE id = %s",
        action.pk,
    )
    if with_digest:
        forged = integrity.effect_digest(Action.objects.get(pk=action.pk).effect)
        with triggers_off("ledger_action") as cursor:
            cursor.execute("UPDATE ledger_action SET effect_digest = %s WHERE id = %s", [forged, action.pk])


def held_for_tampering(task: Task) -> Task:
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.QUARANTINED, integrity.EFFECT_DIGEST_MISMATCH)
    assert Alert.objects.filter(
        task=task, kind=AlertKind.EFFECT_DIGEST_MISMATCH, cleared_at__isnull=True
    ).exists()
    return task


def test_an_effect_altered_by_sql_after_its_intent_is_not_sent_and_quarantines_the_task(acme):
    task = invoice_task(acme, amount="77.00")
    action = intend(task)
    alter_effect(action)
    run(task)
    assert payments() == 0 and not Effect.objects.filter(idempotency_key=action.idempotency_key).exists()
    held = held_for_tampering(task)
    withheld = Action.objects.get(pk=action.pk)
    assert withheld.dispatch_state == DispatchState.FAILED and withheld.attempts == 0
    assert withheld.outcome == {"status": "withheld", "reason": integrity.EFFECT_DIGEST_MISMATCH}
    assert "the action row's effect_digest" in held.events.latest("state_version").reason


def test_an_effect_altered_with_its_row_digest_rewritten_is_caught_by_the_chained_event(acme):
    task = invoice_task(acme, amount="77.00")
    action = intend(task)
    alter_effect(action, with_digest=True)
    run(task)
    assert payments() == 0
    held = held_for_tampering(task)
    assert "the audit chain" in held.events.latest("state_version").reason


def test_an_approved_payment_altered_after_its_approval_is_not_sent(acme, approver):
    task = invoice_task(acme, amount="7500.00")
    assert run(task).state == State.WAITING_APPROVAL
    approve(task, approver)
    action = intend(task)
    alter_effect(action, with_digest=True)
    run(task)
    assert payments() == 0
    held = held_for_tampering(task)
    assert "the approval's digest" in held.events.latest("state_version").reason


def test_an_untampered_approved_payment_is_still_paid(acme, approver):
    task = invoice_task(acme, amount="7500.00")
    assert run(task).state == State.WAITING_APPROVAL
    approve(task, approver)
    assert run(task).state == State.COMPLETED and payments() == 1
    assert Effect.objects.get().request["amount"] == "7500.00"


def test_an_untampered_payment_is_still_paid_once(acme):
    task = run(invoice_task(acme, amount="77.00"))
    assert task.state == State.COMPLETED and payments() == 1
    assert not Alert.objects.filter(kind=AlertKind.EFFECT_DIGEST_MISMATCH).exists()


def test_an_altered_approval_request_copy_quarantines_the_task_and_nothing_is_sent(acme, approver):
    task = invoice_task(acme, amount="7500.00")
    assert run(task).state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    # What the approver is shown: 75.00, while the digest (and the payment) say 7,500.00.
    sql(
        "UPDATE approvals_approvalrequest SET consequential = jsonb_set(consequential, '{effect,amount}', "
        "'\"75.00\"') WHERE id = %s",
        request.pk,
    )
    approve(task, approver)
    run(task)
    assert payments() == 0 and not Action.objects.filter(task=task).exists()
    held = held_for_tampering(task)
    assert "copy" in held.events.latest("state_version").reason


def test_a_payment_approved_and_moved_on_by_sql_without_an_approver_is_not_sent(acme):
    """Two app-role ``UPDATE``s of columns the app writes (a request's ``status``, a task's ``state``)
    paid 5,000 EUR nobody approved: the worker trusted the row's status. The decision is also in the
    task's chained checkpoint (``approval_decide`` commits it with its keyed event), which says pending."""
    task = invoice_task(acme, amount="5000.00")
    assert run(task).state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    sql(
        "UPDATE approvals_approvalrequest SET status = 'approved', decided_at = now() WHERE id = %s",
        request.pk,
    )
    sql("UPDATE tasks_task SET state = 'ready' WHERE id = %s", task.id)
    for _ in range(3):
        run(task)
    assert payments() == 0 and not Action.objects.filter(task=task).exists()
    held = held_for_tampering(task)
    assert "records it pending" in held.events.latest("state_version").reason


def forge_next_checkpoint(task: Task, change: Callable[[dict[str, Any]], None]) -> int:
    """What the app role can do without the chain key: INSERT a checkpoint (``change`` applied to the
    newest one's body) and an event recording its digest whose hash is not a keyed link, then point
    the task at it. Its version."""
    task = Task.objects.get(pk=task.pk)
    newest = Checkpoint.objects.get(task=task, state_version=task.state_version)
    body = json.loads(newest.body)
    change(body)
    forged = json.dumps(body)
    last = task.events.get(state_version=task.state_version)
    version = task.state_version + 1
    Checkpoint.objects.create(
        task=task,
        state_version=version,
        schema_version=newest.schema_version,
        codec=newest.codec,
        body=forged,
        digest=checkpoints.digest(forged),
        created_at=timezone.now(),
    )
    decided = task.state == State.WAITING_APPROVAL
    TransitionEvent.objects.create(
        task=task,
        tenant=task.tenant,
        state_version=version,
        from_state=task.state,
        to_state=State.READY,
        trigger="approval_decided" if decided else "step",
        actor_kind="user" if decided else "worker",
        actor_id="user:nobody" if decided else "worker:nobody",
        attempt=last.attempt,
        policy_version=last.policy_version,
        checkpoint_digest=checkpoints.digest(forged),
        created_at=timezone.now(),
        prev_hash=last.hash,
        hash="f" * 64,  # without the chain key no valid link can be made
        key_id=last.key_id,
    )
    sql("UPDATE tasks_task SET state = 'ready', state_version = %s WHERE id = %s", version, task.id)
    return version


def test_an_approval_forged_with_an_inserted_checkpoint_and_unkeyed_event_is_not_sent(acme):
    """The app role may INSERT events and checkpoints (it writes them) but holds no chain key: a
    forged "approved" checkpoint with a matching event whose hash is not keyed vouches for nothing.
    The worker does not resume from it."""
    task = invoice_task(acme, amount="5000.00")
    assert run(task).state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)

    def approved(body: dict[str, Any]) -> None:
        body["step"] = "pay"
        body["approvals"] = [{**ref, "status": "approved"} for ref in body["approvals"]]

    forge_next_checkpoint(task, approved)
    sql(
        "UPDATE approvals_approvalrequest SET status = 'approved', decided_at = now() WHERE id = %s",
        request.pk,
    )
    for _ in range(3):
        run(task)
    assert payments() == 0 and not Action.objects.filter(task=task).exists()
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "checkpoint_digest_mismatch")


def test_the_send_check_finds_no_keyed_decision_for_a_request_approved_by_sql_only(acme, approver):
    """At the send, the approval is also looked up in the chain (``approval_decided``, keyed)."""
    task = invoice_task(acme, amount="5000.00")
    assert run(task).state == State.WAITING_APPROVAL
    forged = ApprovalRequest.objects.get(task=task)
    sql("UPDATE approvals_approvalrequest SET status = 'approved' WHERE id = %s", forged.pk)
    assert "approved by no keyed approval_decided event" in dispatch._unchained_approval(forged)
    other = invoice_task(acme, amount="6000.00", invoice_id="INV-2")
    assert run(other).state == State.WAITING_APPROVAL
    approve(other, approver)
    assert dispatch._unchained_approval(ApprovalRequest.objects.get(task=other)) == ""


def test_a_payment_whose_facts_were_forged_in_an_inserted_checkpoint_is_not_sent(acme):
    """40.00 EUR under every limit: the forged checkpoint says 990.00, and the worker intended (and
    keyed) what the forged facts said. A worker resumes only from a checkpoint a keyed event records."""
    task = invoice_task(acme, amount="40.00")
    runner.run_task(task.id, worker_id="test-worker", region="default", stopping=lambda: True)

    def pay_more(body: dict[str, Any]) -> None:
        body["facts"] = {**body["facts"], "amount": "990.00"}

    forge_next_checkpoint(task, pay_more)
    for _ in range(3):
        run(task)
    assert [effect.request["amount"] for effect in Effect.objects.filter(system="payments")] == []
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "checkpoint_digest_mismatch")
    assert "written without the chain key" in task.events.latest("state_version").reason


def test_releasing_a_task_held_for_a_tampered_effect_sends_nothing_and_holds_it_again(acme, operator):
    task = invoice_task(acme, amount="77.00")
    action = intend(task)
    alter_effect(action, with_digest=True)
    held = held_for_tampering(run(task))
    controls.task_control(
        held, "release", user=operator, roles=frozenset({"operator"}), expected_version=held.state_version,
        reason="looks fine to me",
    )  # fmt: skip
    again = run(Task.objects.get(pk=task.pk))
    assert payments() == 0
    assert again.state_version > held.state_version
    held_for_tampering(again)


def rerun(task: Task, operator):
    """An operator's rerun over the API, as the console's button makes it."""
    return api_client_for(operator).post(f"/api/tasks/{task.id}/rerun/", {"reason": "again"}, format="json")


def test_an_altered_task_input_is_not_rerun(acme, operator):
    fault("reject")
    task = run(invoice_task(acme, amount="77.00"))
    assert task.state == State.FAILED  # a rerunnable end
    sql(f"UPDATE tasks_task SET input = jsonb_set(input, '{{amount}}', '{ALTERED}') WHERE id = %s", task.pk)
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/rerun/", {"reason": "again"}, format="json"
    )
    assert response.status_code == 400 and integrity.INPUT_DIGEST_MISMATCH in str(response.json())
    assert Task.objects.filter(rerun_of=task).count() == 0 and payments() == 0


def test_an_untampered_failed_task_is_still_rerun(acme, operator):
    fault("reject")
    task = run(invoice_task(acme, amount="77.00"))
    response = api_client_for(operator).post(
        f"/api/tasks/{task.id}/rerun/", {"reason": "again"}, format="json"
    )
    assert response.status_code == 201
    assert run(Task.objects.get(rerun_of=task)).state == State.COMPLETED and payments() == 1


def test_the_quarantine_page_explains_a_tampered_effect(acme, operator, client):
    task = invoice_task(acme, amount="77.00")
    alter_effect(intend(task))
    held_for_tampering(run(task))
    client.force_login(operator)
    page = client.get(f"/console/quarantine/?reason={integrity.EFFECT_DIGEST_MISMATCH}").content.decode()
    assert f"<code>{integrity.EFFECT_DIGEST_MISMATCH}</code>" in page
    assert "is not the one that was intended" in page and "Releasing holds it again, unsent" in page


def test_the_task_page_says_what_a_tampered_effect_hold_means(acme, operator, client):
    task = invoice_task(acme, amount="77.00")
    alter_effect(intend(task))
    held_for_tampering(run(task))
    client.force_login(operator)
    page = client.get(f"/console/tasks/{task.id}/").content.decode()
    assert integrity.EFFECT_DIGEST_MISMATCH in page and "nothing was sent" in page


def test_an_altered_approval_request_copy_shows_as_changed_to_its_approvers(acme):
    task = invoice_task(acme, amount="7500.00")
    assert run(task).state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task)
    assert not approval_services.standing(request).changed
    sql(
        "UPDATE approvals_approvalrequest SET consequential = jsonb_set(consequential, '{effect,amount}', "
        "'\"75.00\"') WHERE id = %s",
        request.pk,
    )
    assert approval_services.standing(ApprovalRequest.objects.get(pk=request.pk)).changed


def test_a_forged_digest_in_the_intents_checkpoint_does_not_vouch_for_an_altered_effect(acme, operator):
    task = invoice_task(acme, amount="77.00")
    action = intend(task)
    intended_at = Task.objects.get(pk=task.pk).state_version
    for control in (
        "quarantine",
        "release",
    ):  # newer versions: the intent's checkpoint is no longer the latest
        current = Task.objects.get(pk=task.pk)
        controls.task_control(
            current, control, user=operator, roles=frozenset({"operator"}),
            expected_version=current.state_version, reason="looking at it",
        )  # fmt: skip
    newer = Checkpoint.objects.filter(task_id=task.id, state_version__gt=intended_at)
    assert runner.run_task(task.id, worker_id="w", region="default", stopping=newer.exists) == "draining"
    alter_effect(action, with_digest=True)
    forged = Action.objects.get(pk=action.pk).effect_digest
    # The app role may rewrite a checkpoint's body (key rotation re-encrypts it in place): make the
    # intent's checkpoint list the forged digest. Its audit event still records the original body's.
    sql(
        "UPDATE tasks_checkpoint SET body = replace(body, %s, %s) WHERE task_id = %s AND state_version = %s",
        action.effect_digest,
        forged,
        task.pk,
        intended_at,
    )
    assert Checkpoint.objects.filter(task=task, state_version=intended_at, body__contains=forged).exists()
    run(task)
    assert payments() == 0
    held = held_for_tampering(task)
    assert (
        "the intent the audit chain records records no digest" in held.events.latest("state_version").reason
    )
