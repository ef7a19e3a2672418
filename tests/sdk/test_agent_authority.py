"""Attacks on the support agent's authority over money: the model's arguments are a request.

A scripted SDK ``Model`` stands in for a model that was prompt-injected or is simply wrong: it emits
the malicious tool call word for word. Each test is an attack that moved money (or reached an
approver, or crash-looped) before the fix, run in-process against the sandbox over real HTTP:

- a refund is bound to the evidence this same task read (``registry.EvidenceBinding``): an order it
  looked up last, at most its total, in its currency, to its card — refused at the call's step (the
  model is told, ``agent_argument_unbound``) and again before the send (``runtime.dispatch``);
- an approved amount changed in the database is still caught by the approval's digest;
- a call id used again for another call quarantines the task (``agent_call_id_reused``);
- an order of another tenant reads as not found (``runtime.evidence``);
- arguments that are not a JSON object are refused (``agent_arguments_malformed``), never a crash loop.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest
from agents import Model, ModelResponse, Usage
from django.db import connection
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from approvals.models import ApprovalRequest
from approvals.services import approval_decide
from audit.models import TransitionEvent
from demo.sandbox.models import Effect
from ledger import integrity
from ledger.models import Action, DispatchState
from runtime import dispatch, evidence, sweep
from runtime.models import Alert
from runtime.sdk import step as agent_step
from tasks import registry
from tasks.models import Task
from tasks.states import State
from tests.conftest import make_task
from tests.runtime.payments import run
from tests.workflow import put_order
from workflows.sdk.support import SUPPORT_AGENT, SupportModel

pytestmark = pytest.mark.django_db(transaction=True)

# One move a model turn: a call (tool, call id, the arguments' JSON text as the model wrote it) or,
# as the last move, the final answer (which repeats the last thing the run was told).
Call = tuple[str, str, str]


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 10
    settings.LEDGER_LOOKUP_INTERVAL = 0
    settings.MODEL_LATENCY_MS = 0
    put_order("A-1", total="500.00", card="visa-1111")


def args(**values: Any) -> str:
    return json.dumps(values)


def lookup(call_id: str, order: str) -> Call:
    return ("lookup_order", call_id, args(order_id=order))


def refund(call_id: str, order: str, amount: str, currency: str = "USD") -> Call:
    return ("refund_order", call_id, args(order_id=order, amount=amount, currency=currency))


class Scripted(Model):
    """A model that makes the given moves whatever it is told: move ``n`` once ``n`` calls have been
    answered (a move may make several calls; ``n`` counts them all). Per brief order id, so two
    tasks of the type can follow two scripts."""

    model_id = SupportModel.model_id  # the approved runtime config's

    def __init__(self, scripts: dict[str, Sequence[Sequence[Call]]]) -> None:
        self.scripts = scripts

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        items = [input] if isinstance(input, str) else list(input)
        asks = [
            i for i in items if isinstance(i, dict) and i.get("role") == "user"
        ]  # the last is this task's
        brief = json.loads(asks[-1]["content"]) if asks else json.loads(items[0])
        after = items[items.index(asks[-1]) :] if asks else items
        told = [
            str(i.get("output"))
            for i in after
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        answered, move = 0, None
        for each in self.scripts[brief["order_id"]]:
            if answered >= len(told):
                move = each
                break
            answered += len(each)
        out: list[Any]
        if move is not None:
            out = [
                ResponseFunctionToolCall(type="function_call", call_id=call_id, name=name, arguments=text)
                for name, call_id, text in move
            ]
        else:
            last = told[-1] if told else "nothing"
            out = [
                ResponseOutputMessage(
                    type="message",
                    id="msg_final",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=f"told: {last}", annotations=[])],
                )
            ]
        return ModelResponse(output=out, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.fixture
def script(monkeypatch):
    """``script({order: moves})``: the support agent's type, its agent on a ``Scripted`` model."""

    def install(scripts: dict[str, Sequence[Sequence[Call]]]) -> None:
        kind = registry.get("support_agent")
        run_step = kind.steps[0]
        assert isinstance(run_step, registry.AgentRun)
        agent = run_step.sdk_agent().clone(model=Scripted(scripts))
        variant = dataclasses.replace(
            kind, steps=(dataclasses.replace(run_step, agent=agent), *kind.steps[1:])
        )
        monkeypatch.setitem(registry._REGISTRY, kind.name, variant)

    return install


def support_task(tenant, order: str = "A-1", amount: str = "30.00", email: str = "c@example.com") -> Task:
    return make_task(
        tenant,
        task_type="support_agent",
        objective=f"Customer asks for a refund of {order}",
        input={"order_id": order, "customer_email": email, "amount": amount, "currency": "USD"},
    )


def run_until_still(task: Task, limit: int = 40) -> Task:
    for _ in range(limit):
        before = task.state_version
        task = run(task)
        if task.state != State.READY or task.state_version == before:
            return task
    raise AssertionError("the agent did not settle")


def codes(task: Task) -> list[str]:
    return list(
        TransitionEvent.objects.filter(task=task)
        .order_by("state_version")
        .values_list("reason_code", flat=True)
    )


def refunds() -> list[dict[str, Any]]:
    return [effect.request for effect in Effect.objects.filter(system="payments").order_by("id")]


def refused_and_told(task: Task, code: str, *words: str) -> None:
    """The call was refused with ``code`` and the model told so (its final answer repeats what it was
    told); nothing reached the ledger, an approver or payments."""
    assert task.state == State.COMPLETED, (task.state, task.state_reason, codes(task))
    assert code in codes(task)
    told = task.outcome["answer"]
    assert '"ok": false' in told and all(word in told for word in words), told
    assert not Action.objects.filter(task=task, step__startswith="refund_order").exists()
    assert not ApprovalRequest.objects.filter(task=task).exists()
    assert refunds() == []


def passes_change_nothing(task: Task) -> None:
    """More claims and sweeps leave a held task held: no crash loop, nothing written or sent."""
    events = TransitionEvent.objects.filter(task=task).count()
    for _ in range(3):
        run(task)
        sweep.sweep(lambda task_id, region: None)
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED
    assert TransitionEvent.objects.filter(task=task).count() == events
    assert refunds() == []


# --- 1. a refund is bound to the evidence this task read -------------------------------------------


def test_a_refund_of_an_order_the_task_never_looked_up_is_refused_and_the_model_told(acme, script):
    script({"A-1": [[refund("c1", "A-1", "30.00")]]})

    task = run_until_still(support_task(acme))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "is not the record this task read with lookup_order")


@pytest.mark.parametrize(
    "amount",
    [
        "45.00",  # under the refund limit: paid without asking anyone, before the fix
        "150.00",  # over it: an approver was asked to consent to refunding more than was paid
    ],
)
def test_a_refund_of_more_than_the_orders_total_is_refused(acme, script, amount):
    put_order("A-2", total="40.00")
    script({"A-2": [[lookup("c1", "A-2")], [refund("c2", "A-2", amount)]]})

    task = run_until_still(support_task(acme, order="A-2"))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, f"amount {amount} is more than order_total 40.00")


@pytest.mark.parametrize("amount", ["-30.00", "0", "Infinity", "thirty"])
def test_a_refund_of_no_positive_amount_is_refused(acme, script, amount):
    script({"A-1": [[lookup("c1", "A-1")], [refund("c2", "A-1", amount)]]})

    task = run_until_still(support_task(acme))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "is not a positive amount")


def test_a_refund_in_another_currency_than_the_orders_is_refused(acme, script):
    script({"A-1": [[lookup("c1", "A-1")], [refund("c2", "A-1", "30.00", currency="EUR")]]})

    task = run_until_still(support_task(acme))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "currency 'EUR' is not order_currency 'USD'")


def test_an_order_with_no_currency_on_record_vouches_for_no_refund(acme, script):
    put_order("A-3", total="90.00", currency="")
    script({"A-3": [[lookup("c1", "A-3")], [refund("c2", "A-3", "10.00")]]})

    task = run_until_still(support_task(acme, order="A-3"))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "states no order_currency")


def test_an_order_of_another_customer_looked_up_in_another_task_cannot_be_refunded(acme, script):
    put_order("A-9", total="300.00", card="visa-9999")  # another customer's order
    script(
        {
            "A-9": [[lookup("c1", "A-9")]],  # their own task looks it up
            "A-1": [[lookup("c1", "A-1")], [refund("c2", "A-9", "60.00")]],  # this one refunds it
        }
    )
    theirs = run_until_still(support_task(acme, order="A-9", email="them@example.com"))
    assert theirs.state == State.COMPLETED

    task = run_until_still(support_task(acme))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "order_id 'A-9' is not the record", "'A-1'")


def test_the_refund_goes_to_the_card_of_the_order_refunded_not_of_another_one_looked_up(acme, script):
    put_order("A-2", total="80.00", card="amex-2222")
    script(
        {
            "A-1": [
                [lookup("c1", "A-1")],
                [lookup("c2", "A-2")],
                [refund("c3", "A-1", "30.00")],  # A-2's card is the task's card fact now: refused
                [lookup("c4", "A-1")],
                [refund("c5", "A-1", "30.00")],  # looked up again: paid, to A-1's card
            ]
        }
    )

    task = run_until_still(support_task(acme))

    assert task.state == State.COMPLETED, (task.state_reason, codes(task))
    assert codes(task).count(registry.ARGUMENT_UNBOUND) == 1
    steps = list(Action.objects.filter(task=task).values_list("step", "dispatch_state"))
    assert steps == [("refund_order#c5", DispatchState.SUCCEEDED)]
    paid = refunds()
    assert [(r["order_id"], r["amount"], r["card"]) for r in paid] == [("A-1", "30.00", "visa-1111")]


def test_a_refund_within_the_evidence_is_paid_to_the_orders_card(acme, script):
    script({"A-1": [[lookup("c1", "A-1")], [refund("c2", "A-1", "30.00")]]})

    task = run_until_still(support_task(acme))

    assert task.state == State.COMPLETED, (task.state_reason, codes(task))
    assert registry.ARGUMENT_UNBOUND not in codes(task)
    assert [(r["order_id"], r["amount"], r["card"]) for r in refunds()] == [("A-1", "30.00", "visa-1111")]


@pytest.mark.parametrize(
    "moves",
    [
        [[refund("c1", "A-2", "30.00")]],  # never looked up
        [[lookup("c1", "A-2")], [refund("c2", "A-2", "45.00")]],  # more than its total
    ],
    ids=["not-looked-up", "over-total"],
)
def test_an_unbound_intent_that_got_past_the_steps_check_is_withheld_at_send(
    acme, script, monkeypatch, moves
):
    # The step's check skipped (a bug, an older worker, a path around it): the send checks again.
    monkeypatch.setattr(agent_step, "_refusal", lambda *args, **kwargs: None)
    put_order("A-2", total="40.00")
    script({"A-2": moves})

    task = run_until_still(support_task(acme, order="A-2"))

    assert (task.state, task.state_reason) == (State.QUARANTINED, registry.ARGUMENT_UNBOUND)
    action = Action.objects.get(task=task)
    assert action.dispatch_state == DispatchState.FAILED and integrity.is_withheld(action.outcome)
    assert action.last_error.startswith(f"{registry.ARGUMENT_UNBOUND}: ")
    assert Alert.objects.filter(task=task, cleared_at__isnull=True).count() == 1
    passes_change_nothing(task)


def test_an_approved_amount_changed_in_the_database_before_the_send_is_not_sent(acme, approver, monkeypatch):
    # The support agent's own model: 150 USD of A-1, over the limit: the approver consents to 150.
    task = run_until_still(support_task(acme, amount="150.00"))
    assert task.state == State.WAITING_APPROVAL
    request = ApprovalRequest.objects.get(task=task, status="pending")
    approval_decide(request, user=approver, decision="approve", digest_seen=request.digest)
    claim = dispatch.claim

    def tampered_claim(action_id: int, **kwargs: Any):
        with connection.cursor() as cursor:  # a database writer raises the intended amount (still < total)
            cursor.execute(
                "UPDATE ledger_action SET effect = jsonb_set(effect::jsonb, '{amount}', '\"450.00\"')"
                " WHERE id = %s",
                [action_id],
            )
        return claim(action_id, **kwargs)

    monkeypatch.setattr(dispatch, "claim", tampered_claim)
    task = run_until_still(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, integrity.EFFECT_DIGEST_MISMATCH)
    assert refunds() == []


def _bound_refund(binding: registry.EvidenceBinding, lookup_facts: dict[str, str]) -> registry.AgentRun:
    tools = (
        registry.AgentEvidence("lookup_order", system="orders", record_from="order_id", facts=lookup_facts),
        registry.AgentEffect("refund_order", connector="payments", effect=lambda a, f: {}, binding=binding),
        registry.AgentEffect("email_customer", connector="email", effect=lambda a, f: {}),
    )
    return registry.AgentRun("agent", agent=SUPPORT_AGENT, tools=tools)


def test_a_binding_to_a_tool_that_reads_no_evidence_is_refused_at_registration():
    binding = registry.EvidenceBinding(evidence="email_customer", record="order_id")
    with pytest.raises(ValueError, match="binding names 'email_customer', no AgentEvidence"):
        _bound_refund(binding, {"total": "order_total"})


def test_a_binding_comparing_a_fact_its_evidence_does_not_keep_is_refused_at_registration():
    binding = registry.EvidenceBinding(
        evidence="lookup_order",
        record="order_id",
        at_most={"amount": "order_total"},
        equal={"currency": "cur"},
    )
    with pytest.raises(ValueError, match=r"compares with \['cur'\], which lookup_order does not keep"):
        _bound_refund(binding, {"total": "order_total"})


# --- 2. a call id used again -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "moves",
    [
        # The lookup's id again, for a refund: the run would be told the lookup's answer as the refund's.
        [[lookup("c1", "A-1")], [refund("c1", "A-1", "30.00")]],
        # A paid refund's id again, for a larger one: told "paid" for a refund never made (or made twice).
        [[lookup("c1", "A-1")], [refund("c2", "A-1", "30.00")], [refund("c2", "A-1", "90.00")]],
        # Two calls of one turn under one id.
        [[lookup("c1", "A-1")], [refund("c2", "A-1", "30.00"), refund("c2", "A-1", "60.00")]],
        # Another id naming the same call step: a long id's digest, written out by the model.
        [
            [lookup("c1", "A-1")],
            [refund("c" * 40, "A-1", "30.00")],
            [refund(registry.call_key("c" * 40), "A-1", "90.00")],
        ],
    ],
    ids=["other-tool", "other-amount", "same-turn", "same-step"],
)
def test_a_call_id_used_again_for_another_call_quarantines_the_task_and_sends_nothing_more(
    acme, script, moves
):
    script({"A-1": moves})

    task = run_until_still(support_task(acme))

    assert (task.state, task.state_reason) == (State.QUARANTINED, agent_step.CALL_ID_REUSED)
    last = TransitionEvent.objects.filter(task=task).latest("state_version")
    assert "again" in last.reason or "name the same call step" in last.reason
    paid_before = refunds()
    assert len(paid_before) <= 1 and all(r["amount"] == "30.00" for r in paid_before)
    assert not Action.objects.filter(task=task, effect__amount__in=["60.00", "90.00"]).exists()
    events = TransitionEvent.objects.filter(task=task).count()
    for _ in range(3):
        run(task)
    assert Task.objects.get(pk=task.pk).state == State.QUARANTINED
    assert TransitionEvent.objects.filter(task=task).count() == events
    assert refunds() == paid_before


# --- 3. evidence reads are tenant-scoped -----------------------------------------------------------


def test_another_tenants_order_reads_as_not_found_and_cannot_be_refunded(acme, globex, script):
    put_order("A-7", total="500.00", card="visa-7777", tenant=acme.slug)
    script({"A-7": [[lookup("c1", "A-7")], [refund("c2", "A-7", "50.00")]]})

    task = run_until_still(support_task(globex, order="A-7"))

    refused_and_told(task, registry.ARGUMENT_UNBOUND, "is not the record this task read")
    assert "agent_evidence" in codes(task)  # the look-up was answered: "no such record"
    owned = run_until_still(support_task(acme, order="A-7"))  # its own tenant reads it, and is refunded
    assert owned.state == State.COMPLETED
    assert [(r["order_id"], r["card"]) for r in refunds()] == [("A-7", "visa-7777")]


def test_a_record_of_another_tenant_is_worded_as_one_that_does_not_exist(acme, globex):
    put_order("A-7", total="500.00", tenant=acme.slug)

    assert evidence.fetch("orders", "A-7", tenant=acme.slug).data["total"] == "500.00"
    with pytest.raises(evidence.EvidenceMissing) as theirs:
        evidence.fetch("orders", "A-7", tenant=globex.slug)
    with pytest.raises(evidence.EvidenceMissing) as absent:
        evidence.fetch("orders", "A-8", tenant=globex.slug)
    assert str(theirs.value) == str(absent.value).replace("A-8", "A-7")
    assert evidence.fetch("orders", "A-1", tenant=globex.slug).record_id == "A-1"  # no owner: shared


# --- 4. arguments that are not a JSON object -------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "text", "problem"),
    [
        ("refund_order", "refund A-1 please", "not JSON"),
        ("refund_order", '["A-1", "30.00", "USD"]', "a JSON array, not an object"),
        ("refund_order", '{"order_id": "A-1", "amount": NaN, "currency": "USD"}', "not JSON"),
        (
            "refund_order",
            '{"order_id": "A-1\\u0000", "amount": "30.00", "currency": "USD"}',
            "argument 'order_id'",
        ),
        ("lookup_order", "A-1", "not JSON"),
        ("lookup_order", '"A-1"', "a JSON string, not an object"),
    ],
)
def test_malformed_arguments_are_refused_and_the_model_told_never_a_crash_loop(
    acme, script, tool, text, problem
):
    script({"A-1": [[lookup("c1", "A-1")], [(tool, "c2", text)]]})

    task = run_until_still(support_task(acme))

    refused_and_told(task, agent_step.ARGUMENTS_MALFORMED, problem)
    last = TransitionEvent.objects.filter(task=task, reason_code=agent_step.ARGUMENTS_MALFORMED).get()
    assert f"{tool} (c2) refused" in last.reason
