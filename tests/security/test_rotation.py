"""Key rotation (``manage.py rotate_keys``) and retirement.

Rotation re-seals every sealed field under the first key, in checkpoints and
ledger effects, in batches, and leaves every checkpoint's digest — the one its
audit event recorded — as it was. A run can stop anywhere and the next one
finishes; a run with nothing to do changes nothing. A checkpoint still under a
key that is no longer configured quarantines its task, naming the key.
"""

from __future__ import annotations

import io
import re

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.utils import timezone

from audit import sealing
from audit.models import TransitionEvent
from ledger.models import Action
from tasks import checkpoints, registry, services
from tasks.models import Checkpoint, Task
from tasks.states import State
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import REFUND_INPUT, make_task, progress

pytestmark = pytest.mark.django_db

OLD = f"old:{Fernet.generate_key().decode()}"
NEW = f"new:{Fernet.generate_key().decode()}"
SENSITIVE = registry.sensitive_fields("refund_request")


def under(key_id: str) -> int:
    """Checkpoints holding at least one field sealed under ``key_id``."""
    return Checkpoint.objects.filter(body__contains=f'"$sealed":"{key_id}"').count()


def seed(task: Task, count: int) -> dict[int, str]:
    """``count`` more checkpoints of ``task`` (versions 2…), each with its own sealed card, inserted in
    bulk; returns every checkpoint's digest by version."""
    base = services.latest_checkpoint(task)
    now = timezone.now()
    rows = []
    for version in range(2, count + 2):
        document = base.model_copy(
            update={"state_version": version, "facts": {**base.facts, "refund_card": f"visa-{version:05d}"}}
        )
        body = checkpoints.encode(document, sealed=SENSITIVE)
        rows.append(
            Checkpoint(
                task=task,
                state_version=version,
                schema_version=checkpoints.CURRENT_SCHEMA,
                codec=checkpoints.CODEC,
                body=body,
                digest=checkpoints.digest(body),
                created_at=now,
            )
        )
    Checkpoint.objects.bulk_create(rows, batch_size=1000)
    return dict(Checkpoint.objects.filter(task=task).values_list("state_version", "digest"))


def rotate(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("rotate_keys", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_rotation_over_10k_checkpoints_keeps_every_digest_and_each_opens_under_the_new_key_alone(
    acme, settings
):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = make_task(acme)
    digests = seed(task, 10_000)
    assert under("old") == 10_001

    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"  # the new key first; the old one still opens
    out, err = rotate("--batch-size", "1000")

    # Version 1 seals the customer's address; each seeded version the card too.
    assert "checkpoints: 10001 rows re-sealed under 'new' (fields from old: 20001)" in out
    assert re.search(r"checkpoints .* 10001/10001 rows, 20001 fields, [\d,]+ rows/s, ETA 0:00", err), err
    assert err.count("\n") >= 11  # a progress line per batch
    settings.FIELD_ENCRYPTION_KEYS = NEW  # the old key retired
    assert under("old") == 0
    for row in Checkpoint.objects.filter(task=task).iterator():
        assert row.digest == digests[row.state_version] == checkpoints.digest(row.body)
        checkpoints.verify_stored(
            row.body, codec=row.codec, stored_digest=row.digest, recorded_digest=digests[row.state_version]
        )
        facts = checkpoints.decode(row.body, row.schema_version).facts
        if row.state_version > 1:
            assert facts["refund_card"] == f"visa-{row.state_version:05d}"
    recorded = TransitionEvent.objects.get(task=task, state_version=1).checkpoint_digest
    assert recorded == Checkpoint.objects.get(task=task, state_version=1).digest  # the audit chain holds


def test_rotation_reseals_ledger_effects_and_keeps_their_digests(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = make_task(acme)
    effect = {"kind": "refund", "order_id": "A-1", "amount": "10.00", "currency": "USD", "card": "visa-1881"}
    intent = ActionIntent(step="pay_refund", connector="payments", effect=effect)
    advance(
        task.id, 1, State.READY, actor=Actor.worker("w"), progress=progress("pay_refund"), actions=[intent]
    )
    action = Action.objects.get(task=task)
    assert action.effect["card"][sealing.MARK] == "old"

    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    out, _ = rotate()
    settings.FIELD_ENCRYPTION_KEYS = NEW

    assert "actions: 1 rows re-sealed under 'new' (fields from old: 1)" in out
    action.refresh_from_db()
    assert action.effect["card"][sealing.MARK] == "new"
    assert sealing.open_effect(action.idempotency_key, action.effect) == effect  # what will be sent
    assert action.effect_digest == intent.digest and action.idempotency_key == intent.idempotency_key(task.id)


def test_a_second_run_has_nothing_to_do(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    seed(make_task(acme), 20)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    rotate()
    bodies = list(Checkpoint.objects.order_by("pk").values_list("body", flat=True))

    out, err = rotate()

    assert "checkpoints: 0 rows re-sealed" in out and "Done: every sealed field is under 'new'." in out
    assert err == ""
    assert list(Checkpoint.objects.order_by("pk").values_list("body", flat=True)) == bodies


def test_a_rotation_stopped_after_one_batch_is_finished_by_the_next_run(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    seed(make_task(acme), 49)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"

    out, _ = rotate("--batch-size", "10", "--max-batches", "1")

    assert "Stopped before the end" in out
    assert (under("old"), under("new")) == (40, 10)
    rotate("--batch-size", "10")
    assert (under("old"), under("new")) == (0, 50)


def test_a_batch_that_fails_halfway_is_rolled_back_whole_and_the_next_run_finishes(
    acme, settings, monkeypatch
):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    seed(make_task(acme), 29)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    real, calls = sealing.rotate_text, []

    def dies_on_the_fifteenth(text, ring):
        calls.append(1)
        if len(calls) == 15:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the second batch
        return real(text, ring)

    monkeypatch.setattr(sealing, "rotate_text", dies_on_the_fifteenth)
    with pytest.raises(KeyboardInterrupt):
        rotate("--batch-size", "10")
    assert (under("old"), under("new")) == (20, 10)  # the first batch committed, the second not at all

    monkeypatch.setattr(sealing, "rotate_text", real)
    rotate("--batch-size", "10")
    assert (under("old"), under("new")) == (0, 30)


def test_a_batch_whose_rewrite_would_change_a_checkpoint_digest_is_refused_and_writes_nothing(
    acme, settings, monkeypatch
):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    digests = seed(make_task(acme), 4)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    real = sealing.rotate_text

    def also_touches_other_bytes(text, ring):
        rotated = real(text, ring)
        rotated.value += " "  # outside every envelope: bytes the digest covers
        return rotated

    monkeypatch.setattr(sealing, "rotate_text", also_touches_other_bytes)
    with pytest.raises(CommandError, match="would change a checkpoint's digest: nothing written"):
        rotate("--batch-size", "10")

    assert (under("old"), under("new")) == (5, 0)
    assert dict(Checkpoint.objects.values_list("state_version", "digest")) == digests


def test_dry_run_counts_fields_per_key_and_changes_nothing(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    seed(make_task(acme), 4)
    retired = f"gone:{Fernet.generate_key().decode()}"
    settings.FIELD_ENCRYPTION_KEYS = retired
    seed(make_task(acme, idempotency_key="second"), 0)  # one checkpoint under a key about to be dropped
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    bodies = list(Checkpoint.objects.order_by("pk").values_list("body", flat=True))

    out, _ = rotate("--dry-run")

    assert "checkpoints: 10 sealed fields" in out
    assert re.search(r"old\s+9 fields in\s+5 rows\s+\(to re-seal\)", out), out
    assert re.search(r"gone\s+1 fields in\s+1 rows\s+\(key not held: cannot be re-sealed\)", out), out
    assert list(Checkpoint.objects.order_by("pk").values_list("body", flat=True)) == bodies


def test_fields_under_a_key_no_longer_held_are_left_and_reported(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    seed(make_task(acme), 2)
    settings.FIELD_ENCRYPTION_KEYS = NEW  # the old key removed before rotating

    # Three checkpoints (the address in each, a card in two) and the task's input (the address).
    with pytest.raises(CommandError, match=r"6 sealed fields could not be re-sealed .* 'old': 6"):
        rotate()
    assert under("old") == 3


def test_a_checkpoint_under_a_retired_key_quarantines_its_task_naming_the_key(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = make_task(acme)
    settings.FIELD_ENCRYPTION_KEYS = NEW

    point = services.task_resume_point(task.id, actor=Actor.system("tests"))

    assert point.quarantined
    stored = Task.objects.get(pk=task.pk)
    assert (stored.state, stored.state_reason) == (State.QUARANTINED, "checkpoint_undecryptable")
    reason = stored.events.get(state_version=stored.state_version).reason
    assert "facts.customer_email" in reason and "'old'" in reason and "no longer holds" in reason
    assert REFUND_INPUT["customer_email"] not in reason


def test_an_erased_value_keeps_the_digest_never_opens_and_rotation_leaves_it(acme, settings):
    settings.FIELD_ENCRYPTION_KEYS = OLD
    task = make_task(acme)
    row = Checkpoint.objects.get(task=task)
    erased = sealing.erase_text(row.body)  # what retention does to a terminal task's sensitive values
    Checkpoint.objects.filter(pk=row.pk).update(body=erased)

    assert checkpoints.digest(erased) == row.digest and REFUND_INPUT["customer_email"] not in erased
    with pytest.raises(checkpoints.CheckpointUnreadable, match="facts.customer_email: the value was erased"):
        services.latest_checkpoint(task)
    settings.FIELD_ENCRYPTION_KEYS = f"{NEW},{OLD}"
    out, _ = rotate()
    assert "checkpoints: 0 rows re-sealed" in out and "Done" in out
    assert Checkpoint.objects.get(pk=row.pk).body == erased
