"""The resume loop (``runtime.runner.run_task``): claim, decide, commit under the lease, release.

A decision made from a version that moved on is discarded, a step that blows
up quarantines its task instead of crash-looping, and a task with nothing to
decide yet is held back rather than claimed again at once. Against the
sandbox over real HTTP.
"""

from __future__ import annotations

import pytest

from audit.models import TransitionEvent
from ledger import connectors
from runtime import controls, engine, runner
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import cancel, invoice_task, landed, late_payment, run, wait_until
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 0.3
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1")


def last_event(task: Task) -> TransitionEvent:
    return TransitionEvent.objects.filter(task=task).latest("state_version")


def test_a_stale_decision_is_discarded_not_applied(acme, admin_user, monkeypatch):
    """A worker whose task moved on while it was thinking commits nothing."""
    task = make_task(acme)
    real_decide = engine.decide

    def decide_slowly(task, checkpoint, **kwargs):
        decision = real_decide(task, checkpoint, **kwargs)
        controls.task_control(
            task,
            "escalate",
            user=admin_user,
            roles=frozenset({"admin"}),
            expected_version=task.state_version,
            reason="meanwhile",
        )
        return decision

    monkeypatch.setattr(engine, "decide", decide_slowly)
    outcome = runner.run_task(task.id, worker_id="slow", region="default")
    assert outcome == "stale_version"
    task = Task.objects.get(pk=task.pk)
    assert task.state_version == 2 and last_event(task).trigger == "escalate"


def test_a_step_that_blows_up_quarantines_its_task_instead_of_crash_looping(acme, settings):
    settings.LEDGER_CONNECTORS = {}  # a misconfigured deployment: the payment connector is gone
    connectors.get.cache_clear()
    task = make_task(
        acme, task_type="pay_invoice", objective="Pay", input={"invoice_id": "I-1", "amount": "5.00"}
    )
    assert runner.run_task(task.id, worker_id="w", region="default") == "step_error"
    task = Task.objects.get(pk=task.pk)
    assert (task.state, task.state_reason) == (State.QUARANTINED, "step_error")
    assert "LookupError" in last_event(task).reason
    connectors.get.cache_clear()


def test_a_deferred_cancel_is_not_claimed_again_in_a_tight_loop(acme, operator, settings):
    settings.CONNECTOR_MAX_IN_FLIGHT = 5
    late_payment(1500)
    task = cancel(run(invoice_task(acme)), operator)
    assert runner.run_task(task.id, worker_id="w1", region="default") == "deferred"
    assert runner.run_task(task.id, worker_id="w2", region="default") == "not_claimed"
    wait_until(lambda: landed(task))  # let the late request finish inside this test
