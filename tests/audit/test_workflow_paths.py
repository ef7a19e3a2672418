"""Every path the workflows really produce is a valid path through the transition table.

``verify_audit`` (links, keys and the path check of ``tasks.audit_paths``) over tasks built by
the other suites' own builders, run in-process against the sandbox over real HTTP: refunds
approved and rejected, a booking canceled with its effect left done, then undone by a
compensation run. (To check every suite's tasks, run it with ``-p tests.audit.paths_plugin``.)
"""

from __future__ import annotations

import pytest
from django.core.management import call_command

from approvals.services import approval_decide
from audit.models import AnchorRequest, TransitionEvent
from tasks import compensation
from tasks.models import Task
from tasks.states import State, Trigger
from tests.approvals.conftest import drive_to_approval, fresh, pending_request
from tests.approvals.conftest import run as run_refund
from tests.lifecycle.booking import booking_types, canceled_booking, sandbox
from tests.runtime.payments import run

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["booking_types", "sandbox"]  # fixtures


def verified(capsys) -> str:
    call_command("verify_audit")  # raises CommandError on any problem
    return capsys.readouterr().out


def test_refunds_approved_and_rejected_verify_clean(sandbox, acme, operator, approver, capsys):
    for decision in ("approve", "reject"):
        task = drive_to_approval(acme, operator)
        request = pending_request(task)
        approval_decide(
            request, user=fresh(approver), decision=decision, digest_seen=request.digest, comment=""
        )
        run_refund(task)
    triggers = set(TransitionEvent.objects.values_list("trigger", flat=True))
    assert {Trigger.REQUEST_APPROVAL, Trigger.APPROVAL_DECIDED, Trigger.COMPLETE} <= triggers
    assert "OK: 2 task chains verified" in verified(capsys)
    assert AnchorRequest.objects.filter(reason=Trigger.APPROVAL_DECIDED).count() == 2  # anchored soon


def test_a_canceled_booking_and_its_compensation_run_verify_clean(
    sandbox, booking_types, acme, operator, capsys
):
    task = canceled_booking(acme, operator)
    key = task.outcome["effects_not_undone"][0]["action"]
    undo, created = compensation.start(task, key, user=operator, reason="refund the room")
    undone = run(Task.objects.get(pk=undo.pk))
    assert created and undone.state == State.COMPLETED
    triggers = set(TransitionEvent.objects.values_list("trigger", flat=True))
    assert {Trigger.CANCEL, Trigger.CANCEL_CONFIRMED, Trigger.COMPLETE} <= triggers
    assert "OK: 2 task chains verified" in verified(capsys)
