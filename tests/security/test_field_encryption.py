"""Sensitive fields are sealed at rest, opened only to be used, and never shown to the model.

A refund runs end to end against the sandbox over real HTTP with explicit keys
(``FIELD_ENCRYPTION_KEYS``, the production path): the card, the customer's
address and their answer never appear in a stored checkpoint or ledger row,
yet the systems receive them and the task completes. A sealed value is bound
to its task, version and field: moved or altered, it quarantines the task
(``checkpoint_undecryptable``), although the checkpoint's digest — taken with
the ciphertexts blanked, so that rotation keeps it — still matches.
"""

from __future__ import annotations

import json

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from audit import sealing
from demo.sandbox.models import Effect
from ledger.models import Action
from runtime import runner
from runtime.llm import ScriptedModel
from tasks import checkpoints, registry, services
from tasks.models import Checkpoint, Task
from tasks.registry import Complete, Dispatch, TaskType
from tasks.states import ActorKind, State
from tasks.transitions import Actor
from tests.conftest import REFUND_INPUT, make_task
from tests.runtime.payments import run
from tests.runtime.test_llm import completion, endpoint  # noqa: F401 (the stand-in model server fixture)
from tests.workflow import approve, put_order

pytestmark = pytest.mark.django_db(transaction=True)

KEYS = f"k1:{Fernet.generate_key().decode()}"
CARD = "visa-1881"
EMAIL = REFUND_INPUT["customer_email"]
ANSWER = "the blue vase, cracked"
REASON = "It arrived in pieces, call me on 555 0100"
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.FIELD_ENCRYPTION_KEYS = KEYS  # explicit keys, as in production (not the development key)
    put_order("A-1", card=CARD)


def refund(tenant, **overrides) -> Task:
    return make_task(tenant, input={**REFUND_INPUT, "reason": REASON}, **overrides)


def to_approval(task: Task, **run_options) -> Task:
    """Run a refund through evidence, triage, the customer's answer and the return, to its approval."""
    runner.run_task(task.id, worker_id="w", region="default", **run_options)
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.WAITING_INPUT, task.state_reason
    services.task_provide_input(task, expected_version=task.state_version, answer=ANSWER, actor=INTEGRATOR)
    task = run(Task.objects.get(pk=task.pk))
    services.task_deliver_event(
        task,
        event_key="return-1",
        event_type="shipment.returned",
        payload={"tracking_number": "T-1"},
        actor=INTEGRATOR,
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL, task.state_reason
    return task


def completed(tenant, approver) -> Task:
    task = to_approval(refund(tenant))
    approve(task, approver)
    return run(Task.objects.get(pk=task.pk))


def stored_text(task: Task) -> list[str]:
    """Every checkpoint body and ledger effect of ``task`` exactly as the database holds them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT body FROM tasks_checkpoint WHERE task_id = %s", [task.id])
        bodies = [row[0] for row in cursor.fetchall()]
        cursor.execute("SELECT effect::text FROM ledger_action WHERE task_id = %s", [task.id])
        effects = [row[0] for row in cursor.fetchall()]
    return bodies + effects


def test_a_refund_runs_to_completion_with_encryption_on_and_the_systems_get_the_values(acme, approver):
    task = completed(acme, approver)

    assert task.state == State.COMPLETED, task.state_reason
    sent = {effect.system: effect.request for effect in Effect.objects.all()}
    assert sent["payments"]["card"] == CARD
    assert sent["tickets"]["customer"] == EMAIL and sent["email"]["to"] == EMAIL
    assert services.latest_checkpoint(task).facts["damaged_item"] == ANSWER  # opened as a worker reads it


def test_no_stored_checkpoint_or_ledger_row_holds_a_card_an_address_or_an_answer_in_clear(acme, approver):
    task = completed(acme, approver)
    stored = stored_text(task)

    assert len(stored) >= 10  # every checkpoint of the run, and its three effects
    for text in stored:
        for secret in (CARD, EMAIL, ANSWER, REASON):
            assert secret not in text
    assert any('"$sealed":"k1"' in text for text in stored)
    assert Action.objects.get(task=task, step="pay_refund").effect["card"][sealing.MARK] == "k1"


def test_the_digest_is_over_everything_but_the_ciphertext(acme):
    task = refund(acme)
    row = Checkpoint.objects.get(task=task)
    body = row.body
    assert sealing.has_envelopes(body)
    ring = sealing.parse_keys(f"k2:{Fernet.generate_key().decode()},{KEYS}")
    resealed = sealing.rotate_text(body, ring).value

    assert resealed != body and checkpoints.digest(resealed) == checkpoints.digest(body) == row.digest
    assert checkpoints.digest(body.replace('"USD"', '"EUR"')) != row.digest
    # Rotation changes the key id too, so the digest leaves it out; a wrong one is refused on opening.
    assert checkpoints.digest(body.replace('"$sealed":"k1"', '"$sealed":"k9"')) == row.digest


def _replace_latest_body(task: Task, body: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tasks_checkpoint SET body = %s WHERE task_id = %s AND state_version = %s",
            [body, task.id, task.state_version],
        )


def _envelope_text(body: str, fact: str) -> str:
    start = body.index(f'"{fact}":') + len(f'"{fact}":')
    return body[start : body.index("}", start) + 1]


def _quarantined_with(task: Task) -> Task:
    services.task_resume_point(task.id, actor=Actor.system("tests"))
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_reason) == (State.QUARANTINED, "checkpoint_undecryptable")
    return stored


def test_a_token_copied_from_another_version_quarantines_the_task_though_the_digest_matches(acme):
    task = to_approval(refund(acme))
    earlier = Checkpoint.objects.filter(task=task).order_by("state_version")
    older = next(row for row in earlier if "refund_card" in row.body)
    latest = earlier.last()
    moved = latest.body.replace(
        _envelope_text(latest.body, "refund_card"), _envelope_text(older.body, "refund_card")
    )
    assert moved != latest.body and checkpoints.digest(moved) == latest.digest
    _replace_latest_body(task, moved)

    stored = _quarantined_with(task)
    reason = stored.events.get(state_version=stored.state_version).reason
    assert "facts.refund_card" in reason and "sealed for another task, version or field" in reason


def test_a_token_moved_to_another_field_quarantines_the_task(acme):
    task = refund(acme)
    row = Checkpoint.objects.get(task=task)
    body = row.body.replace(_envelope_text(row.body, "reason"), _envelope_text(row.body, "customer_email"))
    _replace_latest_body(task, body)

    stored = _quarantined_with(task)
    assert "facts.reason" in stored.events.get(state_version=stored.state_version).reason


def test_an_altered_token_quarantines_the_task_naming_the_field_and_key_never_the_value(acme):
    task = refund(acme)
    body = Checkpoint.objects.get(task=task).body
    envelope = _envelope_text(body, "customer_email")
    token = json.loads(envelope)["t"]
    altered = envelope.replace(token, token[:-6] + ("A" if token[-6] != "A" else "B") + token[-5:])
    _replace_latest_body(task, body.replace(envelope, altered))

    stored = _quarantined_with(task)
    reason = stored.events.get(state_version=stored.state_version).reason
    assert "facts.customer_email" in reason and "'k1'" in reason and EMAIL not in reason


# --- the model --------------------------------------------------------------------------------------


def test_the_model_request_carries_no_sensitive_value(acme, endpoint):  # noqa: F811 (the fixture)
    endpoint.reply(payload=completion("refund"))
    to_approval(refund(acme), model=endpoint.model())

    [request] = endpoint.received
    sent = request.body.decode()
    for secret in (CARD, EMAIL, REASON):
        assert secret not in sent
    facts = json.loads(request.json()["messages"][1]["content"])
    assert facts["refund_card"] == facts["customer_email"] == facts["reason"] == sealing.MODEL_MASK
    assert facts["order_status"] == "delivered"  # what triage needs still goes


def test_the_scripted_model_sees_the_facts_masked_too(acme):
    seen = []

    def triage(facts):
        seen.append(dict(facts))
        return "refund"

    runner.run_task(
        refund(acme).id, worker_id="w", region="default", model=ScriptedModel({"refund-triage@1": triage})
    )

    [facts] = seen
    assert facts["refund_card"] == sealing.MODEL_MASK and facts["order_total"] == "100.00"


def test_a_fact_the_task_type_says_the_model_needs_goes_in_clear(acme):
    kind = TaskType(
        name="needs_the_card",
        description="a type whose model checks the card",
        input_model=registry.get("order_lookup").input_model,
        prompt_id="card-check@1",
        steps=(Complete("done"),),
        sensitive=frozenset({"card", "email"}),
        model_sees=frozenset({"card"}),
    )
    registry.register(kind)
    try:
        shown = registry.facts_for_model("card-check@1", {"card": CARD, "email": EMAIL, "order_id": "A-1"})
    finally:
        registry._REGISTRY.pop(kind.name)  # a test's throwaway type
    assert shown == {"card": CARD, "email": sealing.MODEL_MASK, "order_id": "A-1"}


# --- the declaration --------------------------------------------------------------------------------


def test_a_dispatch_sending_a_sensitive_fact_under_an_unmarked_key_is_refused_at_declaration():
    with pytest.raises(ValueError, match=r"send\.to"):
        TaskType(
            name="leaky",
            description="sends the address without marking it",
            input_model=registry.get("order_lookup").input_model,
            sensitive=frozenset({"email"}),
            steps=(
                Dispatch("send", next="done", connector="email", effect=lambda f: {"to": f["email"]}),
                Complete("done"),
            ),
        )


def test_every_registered_type_marks_the_effect_keys_its_sensitive_facts_go_to():
    for name in registry.names():
        assert registry.get(name)._unsealed_effect_keys() == [], name


def test_without_keys_a_production_process_refuses_to_start(settings, monkeypatch):
    settings.FIELD_ENCRYPTION_KEYS = ""
    monkeypatch.setattr(sealing, "dev_keys_allowed", lambda: False)  # DEBUG off, not under tests
    with pytest.raises(ImproperlyConfigured, match="FIELD_ENCRYPTION_KEYS is not set.*refund_request"):
        sealing.check_configuration(["refund_request"])
    sealing.check_configuration([])  # nothing to seal: nothing needed


def test_a_malformed_key_refuses_to_start_without_echoing_it(settings):
    settings.FIELD_ENCRYPTION_KEYS = "k1:not-a-fernet-key-but-a-secret"
    with pytest.raises(ImproperlyConfigured) as refused:
        sealing.check_configuration([])
    assert "'k1'" in str(refused.value) and "not-a-fernet-key" not in str(refused.value)
