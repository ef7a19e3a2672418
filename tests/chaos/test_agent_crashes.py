"""The support agent (an OpenAI Agents SDK agent) under real ``run_worker`` processes, SIGKILLed and frozen.

Issue 23's crash tests: a worker killed while the run waits for the refund's approval, killed after
the refund's intent commits, killed after the refund was sent but before its answer was recorded,
and frozen in a model turn while another worker takes the run over. Whatever the moment, the refund
reaches the payments system once (counted in deliveries, not effects, so the system's own
deduplication cannot hide a second send) with the arguments the run asked for and the approver saw,
every model turn is recorded once, the run is told the ledger's answer, and the task completes once.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from audit.verify import verify_task
from demo.sandbox.models import Effect
from ledger.models import Action, DispatchState
from runtime.models import AgentSnapshot, AgentTurn, ModelUsage
from tasks.models import Lease, Task
from tasks.states import State
from tests.conftest import make_task
from tests.workflow import WorkerProcess, approve, put_order, state_of, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]
FAST = {
    "CONNECTOR_TIMEOUT": "1",
    "LEDGER_LOOKUP_INTERVAL": "0.2",
    "LEDGER_RESEND_BACKOFF": "0.2",
    "UNKNOWN_OUTCOME_ESCALATE_AFTER": "600",
    "MODEL_LATENCY_MS": "0",
}
REFUND = "refund_order#call_2_refund_order"
EMAIL = "email_customer#call_3_email_customer"


@pytest.fixture(autouse=True)
def order(db):
    put_order("A-1", total="500.00")


def support_task(tenant, amount: str) -> Task:
    return make_task(
        tenant,
        task_type="support_agent",
        objective="Customer asks for a refund of A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": amount, "currency": "USD"},
    )


def sent(system: str) -> list[Effect]:
    return list(Effect.objects.filter(system=system))


def assert_completed_once(task: Task, amount: str) -> Task:
    """Completed once, the refund and the e-mail each sent once, each turn recorded once, and the
    run told the ledger's reference for the refund."""
    wait_for(lambda: state_of(task)[0] in (State.COMPLETED, State.QUARANTINED), what="completion")
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.COMPLETED, task.state_reason
    [refund], [email] = sent("payments"), sent("email")
    assert (refund.deliveries, email.deliveries) == (1, 1)
    action = Action.objects.get(task=task, step=REFUND)
    assert action.idempotency_key == refund.idempotency_key and action.external_ref == str(refund.pk)
    assert {k: v for k, v in refund.request.items() if k != "card"} == {
        "kind": "refund",
        "order_id": "A-1",
        "amount": amount,
        "currency": "USD",
    }
    assert f"Refunded {amount} USD for order A-1 (payment {refund.pk})" in task.outcome["answer"]
    assert list(AgentTurn.objects.filter(task=task).order_by("turn").values_list("turn", flat=True)) == [
        1,
        2,
        3,
        4,
    ]
    assert ModelUsage.objects.filter(task=task).count() == 4
    assert TransitionEvent.objects.filter(task=task, trigger="complete").count() == 1
    assert verify_task(task) is None
    return task


def test_killed_while_waiting_for_the_approval_a_fresh_worker_pays_the_approved_refund_once(
    acme, approver, workers
):
    task = support_task(acme, "150.00")
    first = workers(pause_after="waiting_approval", extra_env=FAST)
    first.wait_paused()
    first.kill()
    assert state_of(task)[0] == State.WAITING_APPROVAL
    assert AgentSnapshot.objects.filter(task=task).count() == 1 and not Effect.objects.exists()

    approve(Task.objects.get(pk=task.pk), approver)
    workers(extra_env=FAST)

    assert_completed_once(task, "150.00")
    [request] = ApprovalRequest.objects.filter(task=task)  # asked once, decided once
    assert request.status == "approved"
    approved = {k: v for k, v in request.consequential["effect"].items() if k != "card"}
    [refund] = sent("payments")
    assert {k: v for k, v in refund.request.items() if k != "card"} == approved  # as the approver saw it
    assert refund.request["card"] == "visa-4242"  # the order's card, from the evidence, never the model
    assert Action.objects.get(task=task, step=REFUND).attempts == 1


def test_killed_after_the_refunds_intent_commits_the_next_worker_sends_it_once(acme, workers):
    task = support_task(acme, "30.00")
    first = workers(pause_after="claiming:payments", extra_env=FAST)  # intent committed, not yet claimed
    first.wait_paused()
    first.kill()
    assert Action.objects.get(task=task, step=REFUND).dispatch_state == DispatchState.INTENDED
    assert not Effect.objects.exists()

    workers(extra_env=FAST)

    assert_completed_once(task, "30.00")
    assert Action.objects.get(task=task, step=REFUND).attempts == 1


def test_killed_after_the_refund_was_sent_it_is_reconciled_and_the_run_told_not_resent(acme, workers):
    task = support_task(acme, "30.00")
    first = workers(pause_after="dispatched:payments", extra_env=FAST)  # answered, answer not recorded
    first.wait_paused()
    first.kill()
    assert Action.objects.get(task=task, step=REFUND).dispatch_state == DispatchState.DISPATCHING
    assert len(sent("payments")) == 1 and not sent("email")

    workers(extra_env=FAST)

    assert_completed_once(task, "30.00")
    action = Action.objects.get(task=task, step=REFUND)
    assert (action.dispatch_state, action.attempts) == (DispatchState.RECONCILED_SUCCEEDED, 1)


# --- two workers on one run ---------------------------------------------------------------------------


def _frozen(worker: WorkerProcess) -> bool:
    with open(f"/proc/{worker.process.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def _in_the_third_turn(task: Task, worker: WorkerProcess) -> bool:
    """The refund settled, two turns recorded, and ``worker`` holding the run: it is asking the
    model for the third turn (the step before it is milliseconds of database work)."""
    lease = Lease.objects.filter(task=task, expires_at__gt=timezone.now()).first()
    return (
        lease is not None
        and lease.worker_id.rsplit(":", 1)[1] == str(worker.process.pid)
        and AgentTurn.objects.filter(task=task).count() == 2
        and Action.objects.filter(task=task, step=REFUND, dispatch_state=DispatchState.SUCCEEDED).exists()
    )


def test_two_workers_resuming_one_run_the_one_that_lost_it_discards_its_turn(acme, approver, workers):
    """A worker resuming the approved run is frozen (SIGSTOP) in a model turn past its lease; another
    takes the run over and completes it; the first, thawed, answers its turn and must commit none of
    it: one AgentTurn per turn, nothing sent twice, no event after the completion."""
    task = support_task(acme, "150.00")
    first = workers(pause_after="waiting_approval", extra_env=FAST)
    first.wait_paused()
    first.kill()
    approve(Task.objects.get(pk=task.pk), approver)

    slow = workers(lease_ttl=1, extra_env={**FAST, "MODEL_LATENCY_MS": "3000", "LOG_LEVEL": "INFO"})
    wait_for(lambda: _in_the_third_turn(task, slow), what="the resuming worker in its model turn")
    time.sleep(0.5)  # well inside the 3 s turn
    os.kill(slow.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _frozen(slow), timeout=10, what="the worker to stop")
        workers(lease_ttl=5, extra_env=FAST)  # claims the run once the frozen worker's lease lapses
        done = assert_completed_once(task, "150.00")
        written = TransitionEvent.objects.filter(task=task).count()
    finally:
        os.kill(slow.process.pid, signal.SIGCONT)

    wait_for(
        lambda: "discarded a stale decision" in _output_so_far(slow) or slow.process.poll() is not None,
        timeout=15,
        what="the thawed worker to answer its turn and lose the commit",
    )
    assert slow.process.poll() is None  # it lost a run, not its life
    assert_completed_once(done, "150.00")  # still one of each turn, one refund, one e-mail
    assert TransitionEvent.objects.filter(task=task).count() == written
    assert Task.objects.get(pk=task.pk).state_version == done.state_version


def _output_so_far(worker: WorkerProcess) -> str:
    """What the worker has logged so far, read without blocking (kept across calls)."""
    stream = worker.process.stdout
    assert stream is not None
    os.set_blocking(stream.fileno(), False)
    chunks = [getattr(worker, "seen", b"")]
    try:
        while chunk := os.read(stream.fileno(), 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass  # nothing more for now
    worker.seen = b"".join(chunks)  # type: ignore[attr-defined]
    return worker.seen.decode(errors="replace")  # type: ignore[attr-defined]
