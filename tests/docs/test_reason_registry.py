"""The reason-code registry (`tasks/reasons.py`) against the code that hands tasks their reasons.

`tests/docs/reason_sites.py` finds, with `ast`, every place in the packages that move tasks where a
reason code is given; each code it finds must have an entry in the registry, and each entry must be
found there, or say where it is built at run time. The places the scan cannot resolve are listed below
with the family of codes they produce: a new one fails until someone says what it produces.
"""

from __future__ import annotations

import pytest

from tasks import reasons
from tests.docs import reason_sites

# (path, expression) of each site whose code is built at run time -> what it produces.
DYNAMIC_SITES = {
    ("runtime/controls.py", "reason_code"): "the control's name, or cancel:<scope> (entries with dynamic=)",
    ("runtime/engine.py", "requested"): "the cancel:<scope> its cancel request recorded",
    ("runtime/engine.py", "step.reason"): "a task type's Fail(reason=...), scanned in workflows/",
    ("runtime/engine.py", "f'approval_{verdict}'"): "approval_reapprove / approval_refresh (approvals.gate)",
    ("approvals/services.py", "f'approval_{status}'"): "approval_approved / approval_rejected",
    ("runtime/engine.py", "exc.code"): "EffectMismatch.code and its subclasses' (class constants)",
    ("runtime/sdk/step.py", "exc.code"): "AgentFailed / SnapshotRefused codes, scanned where raised",
    ("tasks/services.py", "exc.reason"): "CheckpointUnreadable's constants",
}
# Codes held in constants the sites reach through a tuple or an enum (the known constant holders).
HOLDERS = (
    ("runtime.sdk.step", "ARGUMENTS_MALFORMED"),  # returned by _refusal, passed on as *refused
)


def codes_in_holders() -> set[str]:
    import importlib

    from runtime.models import AlertKind
    from tasks.checkpoints import CheckpointUnreadable

    found = {str(value) for value in AlertKind.values}
    found |= {v for k, v in vars(CheckpointUnreadable).items() if k.isupper() and isinstance(v, str)}
    found |= {getattr(importlib.import_module(module), name) for module, name in HOLDERS}
    return found


@pytest.fixture(scope="module")
def sites() -> list[reason_sites.Site]:
    return list(reason_sites.sites())


def test_the_scan_finds_the_codes_people_meet(sites):
    found = {code for site in sites for code in site.codes}
    for code in ("checkpoint_digest_mismatch", "refund_needs_manual_review", "effect_deduplicated"):
        assert code in found, code
    assert "cancel:task" in found and "agent_snapshot_too_large" in found  # f-string, module constant


def test_the_scan_resolves_what_the_source_can_say_and_reports_the_rest(tmp_path):
    """A module of its own, written the ways the code gives reason codes."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(
        """
from tasks.models import CancelScope
from tasks.states import Trigger

HELD = "held_by_constant"
REFUSALS = {"a": "refused_a", "b": "refused_b"}


def decide(progress, exc, which, scope):
    advance(reason_code="spelled_out")
    quarantine(progress, HELD, "why")
    retry_later(progress, code="try_again" if which else "try_later")
    advance(reason_code=Trigger.FAILOVER)
    advance(reason_code=f"cancel:{CancelScope.TASK}")
    code = REFUSALS[which]
    advance(reason_code=code, changes={"outcome": {"reason": "in_the_outcome"}})
    Fail("step", reason="declared_failure")
    raise AgentFailed("agent_said_no", "message")
    advance(reason_code=exc.code)
    advance(reason_code=f"cancel:{scope}")


def quarantine(progress, code, reason):
    return Decision(reason_code=code)  # forwarded: its callers are scanned
"""
    )
    found = list(reason_sites.sites(tmp_path, ("pkg",)))
    codes = {code for site in found for code in site.codes}
    assert codes == {
        "spelled_out",
        "held_by_constant",
        "try_again",
        "try_later",
        "failover",
        "cancel:task",
        "refused_a",
        "refused_b",
        "in_the_outcome",
        "declared_failure",
        "agent_said_no",
    }
    assert {(s.path, s.expression) for s in found if s.dynamic} == {
        ("pkg/mod.py", "exc.code"),
        ("pkg/mod.py", "f'cancel:{scope}'"),
    }


def test_every_code_the_source_gives_is_in_the_registry(sites):
    missing = {
        f"{code} ({site.path}:{site.line})"
        for site in sites
        for code in site.codes
        if code not in reasons.BY_CODE
    }
    missing |= {code for code in codes_in_holders() if code not in reasons.BY_CODE}
    assert not missing, f"reason codes with no entry in tasks/reasons.py: {sorted(missing)}"


def test_every_registry_entry_is_produced_by_the_code_or_says_where_it_is_built(sites):
    found = {code for site in sites for code in site.codes} | codes_in_holders()
    unused = [r.code for r in reasons.REASONS if r.code not in found and not r.dynamic]
    assert not unused, f"registry entries no code produces (mark them dynamic=, or remove): {unused}"
    stale = [r.code for r in reasons.REASONS if r.dynamic and r.code in found]
    assert not stale, f"entries marked dynamic although the scan finds them: {stale}"


def test_every_site_the_scan_cannot_resolve_is_explained(sites):
    dynamic = {(site.path, site.expression) for site in sites if site.dynamic}
    unexplained = dynamic - set(DYNAMIC_SITES)
    assert not unexplained, (
        f"reason codes built at run time: say what they produce in DYNAMIC_SITES: {unexplained}"
    )
    assert set(DYNAMIC_SITES) - dynamic == set(), "DYNAMIC_SITES lists sites that are gone"


def test_the_dynamic_families_are_complete():
    from approvals.models import ApprovalStatus
    from runtime.controls import CONTROLS
    from tasks.models import CancelScope

    for scope in CancelScope.values:
        assert f"cancel:{scope}" in reasons.BY_CODE, scope
    for control in set(CONTROLS) - {"cancel"}:
        assert control in reasons.BY_CODE, control
    for status in (ApprovalStatus.APPROVED, ApprovalStatus.REJECTED):
        assert f"approval_{status}" in reasons.BY_CODE, status


def test_each_entry_is_one_code_with_a_place_and_a_meaning():
    codes = [r.code for r in reasons.REASONS]
    assert len(codes) == len(set(codes))
    for reason in reasons.REASONS:
        assert reason.meaning.strip() and reason.where, reason.code
        assert set(reason.where) <= {
            reasons.QUARANTINED,
            reasons.FAILED,
            reasons.WAITING_RETRY,
            reasons.EXPIRED,
            reasons.CANCELED,
            reasons.EVENT,
            reasons.ALERT,
        }, reason.code


def test_the_console_guides_only_codes_the_registry_knows():
    from console.quarantine import BEFORE_RELEASE

    assert set(BEFORE_RELEASE) - set(reasons.BY_CODE) == set()
    for code in BEFORE_RELEASE:
        assert reasons.QUARANTINED in reasons.BY_CODE[code].where, code
