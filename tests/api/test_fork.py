"""POST /api/tasks/{id}/fork/: resume an ended task from a checkpoint version as a new task (issue 26)."""

from __future__ import annotations

import pytest

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from tasks import forks, services
from tasks.audit_paths import verify_chain
from tasks.models import Checkpoint, Task
from tasks.states import State, Trigger
from tasks.transitions import Actor, advance
from tests.api.conftest import post_json, url
from tests.conftest import api_client_for, make_task, progress

pytestmark = pytest.mark.django_db


def ended(tenant, state: State = State.FAILED) -> Task:
    """A refund task with three checkpoints: v1 (its start), v2 (evidence read), v3 (it failed)."""
    task = make_task(tenant)
    task = advance(
        task.id,
        1,
        State.READY,
        actor=Actor.worker("w"),
        trigger=Trigger.STEP,
        progress=progress("ask_customer", order_id="A-1", amount="10.00", order_status="delivered"),
    )
    trigger = {State.FAILED: Trigger.FAIL, State.COMPLETED: Trigger.COMPLETE}[state]
    return advance(
        task.id,
        2,
        state,
        actor=Actor.worker("w"),
        trigger=trigger,
        reason="declined",
        reason_code="refund_needs_manual_review" if state == State.FAILED else "",
        progress=progress("ask_customer", order_id="A-1", amount="10.00", order_status="delivered"),
    )


def fork(client, task: Task, **body):
    return post_json(client, url(task, "fork"), {"reason": "try from there", **body})


def test_a_fork_answers_201_with_a_new_task_at_the_checkpoints_step_and_facts(acme, operator):
    old = ended(acme)
    response = fork(api_client_for(operator), old, version=2)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["rerun_of"] == str(old.id) and body["state"] == State.READY and body["state_version"] == 1
    new = Task.objects.get(pk=body["id"])
    first = services.latest_checkpoint(new)
    assert first.step == "ask_customer" and first.facts["order_status"] == "delivered"
    assert first.tool_calls == [] and first.approvals == [] and first.pending_actions == []
    assert services.task_input(new) == services.task_input(old)


def test_the_fork_is_recorded_in_both_histories_and_the_original_keeps_its_reason(acme, operator):
    old = ended(acme)
    new_id = fork(api_client_for(operator), old, version=2).json()["id"]
    stored = Task.objects.get(pk=old.pk)
    # An audited self-loop: still failed, for the reason it failed (failed triage groups by it).
    assert (stored.state, stored.state_version, stored.state_reason) == (
        State.FAILED,
        4,
        "refund_needs_manual_review",
    )
    mark = TransitionEvent.objects.get(task=old, state_version=4)
    assert (mark.trigger, mark.reason_code, mark.actor_kind) == ("fork", "forked", "operator")
    assert new_id in mark.reason and "checkpoint v2" in mark.reason
    creation = TransitionEvent.objects.get(task_id=new_id, state_version=1)
    assert creation.reason_code == "forked_from" and str(old.id) in creation.reason
    assert forks.origin(Task.objects.get(pk=new_id)) == forks.Origin(old.id, 2)
    # Both chains still verify, each a walk through the one transition table.
    assert verify_chain(stored) is None and verify_chain(Task.objects.get(pk=new_id)) is None


def test_an_editable_field_may_change_and_its_fact_follows(acme, operator):
    old = ended(acme)
    response = fork(api_client_for(operator), old, version=2, input={"amount": "7.50"})
    assert response.status_code == 201, response.content
    new = Task.objects.get(pk=response.json()["id"])
    assert services.task_input(new)["amount"] == "7.50"
    facts = services.latest_checkpoint(new).facts
    assert facts["amount"] == "7.50" and facts["order_status"] == "delivered"  # the rest as at v2
    assert "amount changed" in TransitionEvent.objects.get(task=new, state_version=1).reason


def test_a_field_the_type_keeps_is_400_and_nothing_is_written(acme, operator):
    old = ended(acme)
    response = fork(api_client_for(operator), old, version=2, input={"order_id": "B-2"})
    assert response.status_code == 400
    assert response.json()["code"] == "input_not_editable" and "order_id" in response.json()["detail"]
    bad = fork(api_client_for(operator), old, version=2, input={"amount": "-3"})
    assert bad.status_code == 400 and "amount" in bad.json()["input"]
    assert not Task.objects.filter(rerun_of=old).exists()
    assert Task.objects.get(pk=old.pk).state_version == 3


def test_a_version_without_a_checkpoint_is_404(acme, operator):
    old = ended(acme)
    response = fork(api_client_for(operator), old, version=9)
    assert response.status_code == 404
    assert response.json()["code"] == "checkpoint_not_found" and "version 9" in response.json()["detail"]
    assert fork(api_client_for(operator), old, version=0).status_code == 400
    assert not Task.objects.filter(rerun_of=old).exists()


def test_a_tampered_checkpoint_is_409_and_nothing_is_written(acme, operator):
    old = ended(acme)
    row = Checkpoint.objects.get(task=old, state_version=2)
    Checkpoint.objects.filter(pk=row.pk).update(body=row.body.replace("delivered", "refunded!"))
    response = fork(api_client_for(operator), old, version=2)
    assert response.status_code == 409
    assert response.json()["code"] == "checkpoint_digest_mismatch"
    assert not Task.objects.filter(rerun_of=old).exists()
    assert Task.objects.get(pk=old.pk).state_version == 3


def test_a_task_that_has_not_ended_is_409(acme, operator):
    task = make_task(acme)
    response = fork(api_client_for(operator), task, version=1)
    assert response.status_code == 409 and response.json()["code"] == "not_forkable"
    assert "cancel it first" in response.json()["detail"]


def test_a_completed_task_may_be_forked(acme, operator):
    old = ended(acme, State.COMPLETED)
    assert fork(api_client_for(operator), old, version=1).status_code == 201


def test_roles_and_tenants(acme, operator, auditor, approver, admin_user, outsider):
    old = ended(acme)
    assert fork(api_client_for(auditor), old, version=2).status_code == 403
    assert fork(api_client_for(approver), old, version=2).status_code == 403
    assert fork(api_client_for(outsider), old, version=2).status_code == 404  # a tenant you do not hold
    response = fork(api_client_for(admin_user), old, version=2)
    assert response.status_code == 201
    mark = TransitionEvent.objects.get(task=old, trigger="fork")
    assert mark.actor_kind == "admin"


def test_the_same_key_answers_the_same_fork_and_writes_nothing_more(acme, operator):
    old = ended(acme)
    client = api_client_for(operator)
    first = fork(client, old, version=2, idempotency_key="f-1")
    again = fork(client, old, version=2, idempotency_key="f-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert TransitionEvent.objects.filter(task=old, trigger="fork").count() == 1
    # The key, for another request: another version, another input.
    for other in (
        fork(client, old, version=1, idempotency_key="f-1"),
        fork(client, old, version=2, idempotency_key="f-1", input={"amount": "9.00"}),
    ):
        assert other.status_code == 409 and other.json()["code"] == "idempotency_conflict"
    assert TransitionEvent.objects.filter(task=old, trigger="fork").count() == 1


def test_no_approval_is_carried(acme, operator, approver):
    old = ended(acme)
    new_id = fork(api_client_for(operator), old, version=2).json()["id"]
    assert not ApprovalRequest.objects.filter(task_id=new_id).exists()
