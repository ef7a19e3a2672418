"""Is the effect about to be sent the one that was intended? The digest every copy is compared by.

An action's ``effect_digest`` is written by the transition that intends it
(``tasks.transitions.ActionIntent.digest``: this module's ``effect_digest`` of
the effect in clear) and recorded again in that transition's checkpoint
(``pending_actions``), whose digest the transition's keyed audit event records.
Right before a send the dispatcher (``runtime.dispatch``) recomputes the digest
of the effect as it will be sent and compares it with each copy
(``mismatch``); any difference sends nothing and holds the task with
``EFFECT_DIGEST_MISMATCH``.

Pure functions: no database. Reading the chained copy is ``runtime.dispatch``'s.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from typing import Any

from audit import canonical

# Reason codes (``Task.state_reason``) of a task held because a consequential copy is not what
# was committed: the effect (or an approval's copy of it), or the task's input.
EFFECT_DIGEST_MISMATCH = "effect_digest_mismatch"
INPUT_DIGEST_MISMATCH = "input_digest_mismatch"
# ``Action.outcome`` of an effect withheld for that reason: never sent, not "rejected" by the system.
WITHHELD = "withheld"


def effect_digest(effect: Mapping[str, Any]) -> str:
    """The digest an intent's effect (in clear) is bound by: SHA-256 of canonical JSON, format V1.

    V1 (text as UTF-8): every stored ``effect_digest`` and idempotency key was written so.
    """
    return canonical.digest(effect, version=canonical.V1)


def mismatch(actual: str, recorded: str | None, what: str) -> str:
    """Why ``actual`` disagrees with the digest ``what`` records, in words; "" when they agree.

    ``recorded`` None: no such record was found, which is a mismatch too: a send is never
    trusted on a record that is missing.
    """
    if recorded is None:
        return f"{what} records no digest for this effect"
    if not hmac.compare_digest(actual.encode(), recorded.encode()):
        return f"the effect to be sent (digest {actual[:12]}…) differs from {what} ({recorded[:12]}…)"
    return ""


def withheld_outcome() -> dict[str, str]:
    """What a withheld action's ``outcome`` says (and how ``is_withheld`` knows it)."""
    return {"status": WITHHELD, "reason": EFFECT_DIGEST_MISMATCH}


def is_withheld(outcome: Any) -> bool:
    """Was this action withheld unsent because its effect was not what was intended?"""
    return isinstance(outcome, dict) and outcome == withheld_outcome()
