"""The task page of an SDK agent's task: its turns, what each asked for, and what our records made of it.

The support agent runs for real (the in-process resume loop against the sandbox over HTTP, its
deterministic SDK model), so the page reads rows the runtime wrote, not rows made up to fit it.
"""

from __future__ import annotations

import html
import re
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest
from django.db import connection
from django.test import Client

from approvals.models import ApprovalRequest
from audit.models import TransitionEvent
from ledger.models import Action
from runtime.models import AgentTurn, ModelUsage
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10  # a loaded machine (a browser starting) is not what these test
    settings.LEDGER_LOOKUP_INTERVAL = 0
    put_order("A-1", total="500.00")


def support_task(tenant, amount: str) -> Task:
    return make_task(
        tenant,
        task_type="support_agent",
        objective="Customer asks for a refund of A-1",
        input={"order_id": "A-1", "customer_email": "c@example.com", "amount": amount, "currency": "USD"},
    )


def off_the_loop(work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own, as a worker runs it. Once a browser test has run in this
    process, Playwright's sync API keeps an event loop running in the main thread, and the SDK's
    runner (``asyncio.run``) will not start under a running loop (the step would retry later)."""
    done: list[T] = []

    def target() -> None:
        try:
            done.append(work())
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=300)
    assert done, "the work in the thread did not finish"
    return done[0]


def run_until_still(task: Task, limit: int = 40) -> Task:
    def rounds() -> Task:
        current = Task.objects.get(pk=task.pk)
        for _ in range(limit):
            before = current.state_version
            current = run(current)
            if current.state != State.READY or current.state_version == before:
                return current
        raise AssertionError("the agent did not settle")

    return off_the_loop(rounds)


def turns_of(user, task: Task) -> list[str]:
    """Each row of the page's "Agent turns" table as text, tags stripped and spaces collapsed."""
    client = Client()
    client.force_login(user)
    response = client.get(f"/console/tasks/{task.id}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "Agent turns" in page
    section = page.split('id="agent-turns"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r'<tr class="turn".*?</tr>', section, flags=re.S)
    return [" ".join(html.unescape(re.sub(r"<[^>]+>", " ", row)).split()) for row in rows]


def test_a_completed_refund_shows_each_turn_its_calls_their_fates_and_its_usage(acme, operator):
    task = run_until_still(support_task(acme, "30.00"))
    assert task.state == State.COMPLETED, task.state_reason

    rows = turns_of(operator, task)

    assert len(rows) == 4
    lookup, refund, email, final = rows
    assert lookup.startswith("1 support scripted-support-v1 lookup_order ( call_1_lookup_order )")
    assert "lookup_order read orders/A-1 v1" in lookup  # the evidence read, as its transition says
    refund_action = Action.objects.get(task=task, step="refund_order#call_2_refund_order")
    assert f"refund_order ( call_2_refund_order ) → succeeded · {refund_action.external_ref}" in refund
    assert f"action #{refund_action.id}" in refund
    assert "email_customer ( call_3_email_customer ) → succeeded" in email
    assert final.startswith("4 support scripted-support-v1 answered")
    # Each turn's tokens are its own usage row (the version it was decided from), and its transition:
    # the one that committed it with what it led to (the read, the call's intent, the answer).
    turns = AgentTurn.objects.filter(task=task).order_by("turn")
    committed = [TransitionEvent.objects.get(task=task, state_version=t.state_version + 1) for t in turns]
    codes = [event.reason_code for event in committed]
    assert codes == ["agent_evidence", "agent_tool_call", "agent_tool_call", "agent_finished"]
    for row, turn, event in zip(rows, turns, committed, strict=True):
        used = ModelUsage.objects.get(task=task, state_version=turn.state_version)
        assert f"{used.input_tokens} / {used.output_tokens}" in row
        assert f"v{event.state_version} {event.reason_code}" in row
    # What the customer wrote and the call's arguments stay out of the page's turns.
    assert "c@example.com" not in " ".join(rows) and "30.00" not in " ".join(rows)


def test_a_refund_waiting_for_its_approver_then_rejected_says_so_per_call(acme, operator, approver):
    task = run_until_still(support_task(acme, "150.00"))
    assert task.state == State.WAITING_APPROVAL

    rows = turns_of(operator, task)
    assert len(rows) == 2
    assert "refund_order ( call_2_refund_order ) → waiting for an approver · approval pending" in rows[1]

    approve(task, approver, decision="reject")
    task = run_until_still(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED, task.state_reason

    rows = turns_of(operator, task)
    assert "→ rejected by an approver: not performed · approval rejected" in rows[1]
    assert rows[-1].startswith("3 support scripted-support-v1 answered")
    assert not Action.objects.filter(task=task).exists()
    assert ApprovalRequest.objects.get(task=task).status == "rejected"
