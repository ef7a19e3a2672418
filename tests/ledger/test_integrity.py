"""What binds an effect to its intent (``ledger.integrity``), and that every intent is bound."""

from __future__ import annotations

import pytest

from ledger import integrity
from ledger.models import Action
from tasks.states import State, Trigger
from tasks.transitions import ActionIntent, Actor, advance
from tests.conftest import make_task, progress

pytestmark = pytest.mark.django_db

EFFECT = {"kind": "charge", "amount": "77.00", "currency": "EUR"}


def test_the_stored_digest_of_an_intent_is_the_one_the_dispatcher_recomputes(acme):
    task = make_task(acme)
    intent = ActionIntent(step="pay", connector="payments", effect=EFFECT)
    advance(
        task.id, 1, State.READY, actor=Actor.worker("w"), trigger=Trigger.STEP, progress=progress("pay"),
        actions=[intent],
    )  # fmt: skip
    assert Action.objects.get(task=task).effect_digest == integrity.effect_digest(EFFECT) == intent.digest


def test_an_intent_without_a_checkpoint_is_refused_and_nothing_is_written(acme):
    task = make_task(acme)
    intent = ActionIntent(step="pay", connector="payments", effect=EFFECT)
    with pytest.raises(ValueError, match="an intent commits with a checkpoint"):
        advance(task.id, 1, State.READY, actor=Actor.worker("w"), trigger=Trigger.STEP, actions=[intent])
    assert not Action.objects.filter(task=task).exists()


def test_a_digest_that_differs_or_is_missing_is_a_mismatch_in_words():
    actual = integrity.effect_digest(EFFECT)
    assert integrity.mismatch(actual, actual, "the row") == ""
    altered = integrity.effect_digest({**EFFECT, "amount": "99999.00"})
    assert integrity.mismatch(altered, actual, "the row").startswith("the effect to be sent (digest")
    assert integrity.mismatch(actual, None, "the chain") == "the chain records no digest for this effect"
