"""An agent run's records at rest: the transcript and run states sealed, re-sealed by key rotation."""

from __future__ import annotations

import io
import json

import pytest
from cryptography.fernet import Fernet
from django.core.management import call_command

from audit import sealing
from runtime.models import AgentSnapshot, AgentTurn
from tasks.states import State
from tests.sdk.test_support_agent import run_until_still, sandbox, support_task  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
OLD = f"old:{Fernet.generate_key().decode()}"
NEW = f"new:{Fernet.generate_key().decode()}"


def test_turns_and_run_states_are_sealed_and_key_rotation_reseals_them(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = run_until_still(support_task(acme, amount="150.00"))
    assert task.state == State.WAITING_APPROVAL, list(task.events.values_list("reason_code", "reason"))[-1]
    turn = AgentTurn.objects.filter(task=task).order_by("turn").first()
    snapshot = AgentSnapshot.objects.get(task=task)
    # Nothing of the conversation in clear: its JSON keys (no base64 token holds a quote) only inside.
    assert '"order_id"' not in json.dumps(turn.response) and "lookup_order" not in json.dumps(turn.response)
    assert '"order_id"' not in json.dumps(snapshot.body) and "lookup_order" not in json.dumps(snapshot.body)
    assert turn.response[sealing.MARK] == "old" and snapshot.body[sealing.MARK] == "old"

    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    out = io.StringIO()
    call_command("rotate_keys", stdout=out, stderr=io.StringIO())
    settings.FIELD_ENCRYPTION_KEYS = NEW

    assert "agent turns: 2 rows re-sealed under 'new'" in out.getvalue()
    assert "agent snapshots: 1 rows re-sealed under 'new'" in out.getvalue()
    turn.refresh_from_db()
    snapshot.refresh_from_db()
    assert turn.response[sealing.MARK] == "new" and snapshot.body[sealing.MARK] == "new"
    # The run resumes from them under the new key alone: the pause is still the same pause.
    task = run_until_still(task)
    assert task.state == State.WAITING_APPROVAL, (
        task.state_reason,
        list(task.events.values_list("reason", flat=True))[-2:],
    )
    assert AgentSnapshot.objects.filter(task=task).count() == 1
