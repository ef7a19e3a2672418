"""No clear copy of a sensitive field anywhere: every column that keeps one keeps it sealed.

A refund runs end to end against the sandbox over real HTTP with explicit keys,
its input holding a card (in the customer's reason) and an e-mail address, an
answer and an external event carrying the address. Afterwards no text or JSON
column of any table of the project holds any of them in clear — checkpoints and
effects (sealed before), and now the task's input and outcome, the input answer,
the event, the approval request's card and facts. The task still completes, every
surface shows masks, the approval's digest (over the clear values) still
verifies when it is decided, ``rotate_keys`` re-seals these columns too, and the
same create with the same idempotency key still returns the same task.
"""

from __future__ import annotations

import io
import json

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command
from django.db import connection
from django.test import Client

from approvals.digest import digest
from approvals.models import ApprovalRequest
from audit import sealing
from audit.redaction import redact, sensitive_fields
from console.quarantine import BEFORE_RELEASE
from runtime import runner
from tasks import services
from tasks.models import ExternalEvent, Task, TaskInput
from tasks.states import ActorKind, State, Trigger
from tasks.transitions import Actor, advance
from tests.conftest import REFUND_INPUT, api_client_for, make_task
from tests.runtime.payments import run
from tests.workflow import put_order

pytestmark = pytest.mark.django_db(transaction=True)

OLD = f"old:{Fernet.generate_key().decode()}"
NEW = f"new:{Fernet.generate_key().decode()}"
ORDER_CARD = "visa-1881"  # the card the order system holds: the refund goes to it
INPUT_CARD = "4111-2222-3333-4444"  # the card the customer wrote in their reason
EMAIL = "jane.roe@example.org"
ANSWER = "the blue vase, cracked"
SECRETS = (ORDER_CARD, INPUT_CARD, EMAIL, ANSWER)
INPUT = {**REFUND_INPUT, "customer_email": EMAIL, "reason": f"Please refund to {INPUT_CARD}"}
INTEGRATOR = Actor(ActorKind.INTEGRATOR, "tests")


@pytest.fixture(autouse=True)
def sandbox(live_server, settings):
    settings.SANDBOX_BASE_URL = f"{live_server.url}/sandbox"
    settings.CONNECTOR_TIMEOUT = 2
    settings.FIELD_ENCRYPTION_KEYS = OLD  # explicit keys, as in production
    put_order("A-1", card=ORDER_CARD)


def to_approval(tenant) -> Task:
    """A refund through evidence, triage, the customer's answer and the return, to its approval. The
    return event also names the customer (a sensitive key of the type)."""
    task = make_task(tenant, input=INPUT, idempotency_key="refund-1")
    runner.run_task(task.id, worker_id="w", region="default")
    task = Task.objects.get(pk=task.pk)
    assert task.state == State.WAITING_INPUT, task.state_reason
    services.task_provide_input(task, expected_version=task.state_version, answer=ANSWER, actor=INTEGRATOR)
    task = run(Task.objects.get(pk=task.pk))
    services.task_deliver_event(
        task,
        event_key="return-1",
        event_type="shipment.returned",
        payload={"tracking_number": "T-1", "customer_email": EMAIL},
        actor=INTEGRATOR,
    )
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.WAITING_APPROVAL, task.state_reason
    return task


def decide(task: Task, approver) -> ApprovalRequest:
    """Approve through the API, with the digest the API shows."""
    [row] = api_client_for(approver).get("/api/approvals/", {"status": "pending"}).json()["results"]
    response = api_client_for(approver).post(
        f"/api/approvals/{row['id']}/decide/",
        json.dumps({"decision": "approve", "digest": row["digest"]}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return ApprovalRequest.objects.get(pk=row["id"])


def stored_columns() -> dict[str, list[str]]:
    """Every text and JSON column of every table of the project, as text, by ``table.column``.

    The sandbox's tables are left out: they stand in for the outside systems (the order system
    that holds the card, the payments system the refund is sent to), which hold the values by design.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = current_schema()"
            " AND data_type IN ('text', 'character varying', 'character', 'json', 'jsonb')"
            " AND table_name NOT LIKE %s"
            " AND table_name IN (SELECT table_name FROM information_schema.tables"
            "   WHERE table_schema = current_schema() AND table_type = 'BASE TABLE')",
            ["sandbox\\_%"],
        )
        columns = cursor.fetchall()
        found = {}
        for table, column in columns:
            cursor.execute(f'SELECT "{column}"::text FROM "{table}" WHERE "{column}" IS NOT NULL')
            found[f"{table}.{column}"] = [row[0] for row in cursor.fetchall()]
    return found


def clear_copies(columns: dict[str, list[str]]) -> list[str]:
    """``table.column: secret`` for each secret found in clear in a column."""
    return [
        f"{where}: {secret}"
        for where, texts in columns.items()
        for secret in SECRETS
        if any(secret in text for text in texts)
    ]


def test_after_a_refund_no_column_of_any_table_holds_a_card_an_address_or_an_answer_in_clear(acme, approver):
    task = to_approval(acme)
    decide(task, approver)
    task = run(Task.objects.get(pk=task.pk))

    assert task.state == State.COMPLETED, task.state_reason
    columns = stored_columns()
    assert len(columns) > 50 and len(columns["tasks_task.input"]) == 1  # the dump does see the rows
    assert clear_copies(columns) == []
    # Each copy is sealed, and opens where it belongs.
    assert task.input["customer_email"][sealing.MARK] == "old"
    assert services.task_input(task) == {**INPUT, "currency": "USD"}
    assert sealing.open_all(task.outcome, sealing.task_place(task.id, "outcome"))["damaged_item"] == ANSWER
    answer = TaskInput.objects.get(task=task)
    assert answer.payload["answer"][sealing.MARK] == "old"
    event = ExternalEvent.objects.get(task=task)
    assert services.event_payload(event) == {"tracking_number": "T-1", "customer_email": EMAIL}
    assert event.payload["tracking_number"] == "T-1"  # not sensitive: as delivered


def test_the_api_and_console_show_the_task_masked_and_search_does_not_match_a_sealed_value(
    acme, approver, auditor
):
    task = to_approval(acme)
    decide(task, approver)
    task = run(Task.objects.get(pk=task.pk))
    client = api_client_for(auditor)
    console = Client()
    console.force_login(auditor)

    detail = client.get(f"/api/tasks/{task.id}/").json()
    page = console.get(f"/console/tasks/{task.id}/").content.decode()

    assert detail["input"]["customer_email"] == "••••" and detail["input"]["reason"] == "•••• 4444"
    assert detail["input"]["order_id"] == "A-1" and detail["outcome"]["damaged_item"] == "••••"
    assert detail["outcome"]["return_tracking"] == "T-1"
    for shown in (json.dumps(detail, ensure_ascii=False), page):
        assert not [secret for secret in SECRETS if secret in shown]
    assert "•••• 4444" in page
    found = client.get("/api/tasks/", {"q": EMAIL}).json()["results"]
    assert found == [] and client.get("/api/tasks/", {"q": "A-1"}).json()["results"][0]["id"] == str(task.id)


def test_the_approval_card_is_masked_and_its_digest_of_the_clear_values_verifies_on_decide(
    acme, approver, operator
):
    task = to_approval(acme)
    request = ApprovalRequest.objects.get(task=task)
    console = Client()
    console.force_login(approver)

    [row] = api_client_for(approver).get("/api/approvals/", {"status": "pending"}).json()["results"]
    inbox = console.get("/console/approvals/").content.decode()
    card = console.get(f"/console/approvals/{request.id}/").content.decode()

    assert row["consequential"]["effect"]["card"] == "•••• 1881"
    assert request.consequential["effect"]["card"][sealing.MARK] == "old"
    for shown in (json.dumps(row, ensure_ascii=False), inbox, card):
        assert ORDER_CARD not in shown and "•••• 1881" in shown
    assert 'id="masked-note"' in card
    # The approver signs the digest of the clear card: what the payments system will be sent.
    assert digest(request.opened("consequential")) == request.digest == row["digest"]
    assert decide(task, approver).status == "approved"
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED, task.state_reason


def test_rotate_keys_reseals_the_task_answer_event_and_approval_columns(acme, approver, settings):
    task = to_approval(acme)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"

    out = io.StringIO()
    call_command("rotate_keys", stdout=out, stderr=io.StringIO())

    report = out.getvalue()
    for line in (
        "task inputs: 1 rows re-sealed under 'new' (fields from old: 2)",
        "answers: 1 rows re-sealed under 'new' (fields from old: 1)",
        "events: 1 rows re-sealed under 'new' (fields from old: 1)",
        "approvals: 1 rows re-sealed under 'new' (fields from old: 1)",
        "Done: every sealed field is under 'new'.",
    ):
        assert line in report, report
    settings.FIELD_ENCRYPTION_KEYS = NEW  # the old key retired: everything must open under the new one
    assert not [where for where, texts in stored_columns().items() for text in texts if '"old"' in text]
    task = Task.objects.get(pk=task.pk)
    assert services.task_input(task)["customer_email"] == EMAIL
    assert services.event_payload(ExternalEvent.objects.get(task=task))["customer_email"] == EMAIL
    assert decide(task, approver).opened("consequential")["effect"]["card"] == ORDER_CARD
    task = run(Task.objects.get(pk=task.pk))
    assert task.state == State.COMPLETED, task.state_reason
    assert sealing.open_all(task.outcome, sealing.task_place(task.id, "outcome"))["damaged_item"] == ANSWER


def test_the_same_key_returns_the_same_task_though_each_sealing_differs(acme):
    first = make_task(acme, input=INPUT, idempotency_key="same")
    again = make_task(acme, input=dict(INPUT), idempotency_key="same")

    assert again.pk == first.pk and Task.objects.count() == 1
    with pytest.raises(services.IdempotencyConflict):
        make_task(acme, input={**INPUT, "customer_email": "other@example.org"}, idempotency_key="same")
    # Sealing the same value twice gives two tokens: the key compares digests of the clear request.
    assert services.seal_input("refund_request", first.pk, INPUT) != first.input


def test_an_answer_repeated_for_the_same_wait_is_recognised_though_it_is_stored_sealed(acme):
    task = make_task(acme, input=INPUT)
    runner.run_task(task.id, worker_id="w", region="default")
    task = Task.objects.get(pk=task.pk)
    waiting_at = task.state_version
    services.task_provide_input(task, expected_version=waiting_at, answer=ANSWER, actor=INTEGRATOR)

    repeat = services.task_provide_input(task, expected_version=waiting_at, answer=ANSWER, actor=INTEGRATOR)

    assert not repeat.applied and TaskInput.objects.filter(task=task).count() == 1
    assert ANSWER not in json.dumps(TaskInput.objects.get(task=task).payload)


def test_an_event_whose_sealed_value_was_moved_quarantines_the_task_when_it_is_used(acme):
    task = make_task(acme, input=INPUT)
    runner.run_task(task.id, worker_id="w", region="default")
    task = Task.objects.get(pk=task.pk)
    payload = {"tracking_number": "T-1", "customer_email": EMAIL}
    # Early: kept until the task waits for it.
    services.task_deliver_event(
        task, event_key="r-1", event_type="shipment.returned", payload=payload, actor=INTEGRATOR
    )
    moved = sealing.seal(EMAIL, sealing.task_place(task.id, "events", "another", "payload", "customer_email"))
    ExternalEvent.objects.filter(task=task).update(
        payload={"tracking_number": "T-1", "customer_email": moved}
    )
    services.task_provide_input(task, expected_version=task.state_version, answer=ANSWER, actor=INTEGRATOR)

    task = run(Task.objects.get(pk=task.pk))

    assert (task.state, task.state_reason) == (State.QUARANTINED, "event_undecryptable")
    assert "FIELD_ENCRYPTION_KEYS" in BEFORE_RELEASE["event_undecryptable"]


def test_the_quarantine_page_says_to_restore_a_retired_key_before_releasing(acme, operator, settings):
    task = make_task(acme, input=INPUT)
    settings.FIELD_ENCRYPTION_KEYS = NEW  # the key its checkpoint was sealed under is gone
    assert services.task_resume_point(task.id, actor=Actor.system("tests")).quarantined
    console = Client()
    console.force_login(operator)

    page = console.get("/console/quarantine/", {"reason": "checkpoint_undecryptable"}).content.decode()

    assert "Before releasing:" in page and "put it back in FIELD_ENCRYPTION_KEYS" in page
    assert "sealed fields opened with the keys in FIELD_ENCRYPTION_KEYS" in page  # what release checks


def test_a_rerun_of_a_task_whose_input_key_was_retired_is_refused_naming_the_field(acme, settings):
    task = make_task(acme, input=INPUT)
    task = advance(task.id, 1, State.FAILED, actor=Actor.worker("w"), trigger=Trigger.FAIL, reason="declined")
    settings.FIELD_ENCRYPTION_KEYS = NEW  # the key the input was sealed under is gone

    with pytest.raises(services.InvalidTaskInput) as refused:
        services.task_rerun(task, actor=INTEGRATOR, reason="again")

    [problem] = refused.value.errors["input"]  # the first sealed field found (jsonb orders the keys)
    assert problem in ("customer_email cannot be read (key_missing)", "reason cannot be read (key_missing)")
    assert Task.objects.count() == 1


def test_log_text_masks_the_types_sensitive_field_names_but_not_ordinary_words():
    names = sensitive_fields()

    assert {"refund_card", "customer_email", "damaged_item", "card", "customer"} <= names
    assert not names & {"reason", "to"}
    assert (
        redact(f"reason=retries_exhausted refund_card={ORDER_CARD}")
        == "reason=retries_exhausted refund_card=***"
    )
