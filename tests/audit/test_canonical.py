"""Canonical JSON (``audit.canonical``): the rules of each format, and replay of stored values.

The replay half reads ``tests/fixtures/canonical/stored_v1.json``: a chain,
actions, an approval request, checkpoints, request and input digests, all as
the code before ``audit.canonical`` stored them on PostgreSQL. Every value must
come out again byte for byte, through the module and through each call site.

No database: the module is pure, and the call sites' hashing is too.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import unicodedata
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from approvals import digest as approval_digest
from audit import canonical
from audit.canonical import V1, V1_ASCII, V2
from audit.chain import GENESIS, HASHED_FIELDS, OPTIONAL_HASHED_FIELDS, event_hash, verify_events
from tasks import checkpoints, services
from tasks.transitions import ActionIntent

ROOT = Path(__file__).resolve().parents[2]
STORED = json.loads((ROOT / "tests/fixtures/canonical/stored_v1.json").read_text())
WHEN = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
ID = UUID("01a22c79-8a85-7736-b736-6942a13c781e")


# --- the code before audit.canonical, verbatim: what every stored value was written with ----------


def old_chain_body(covered: dict[str, Any]) -> str:  # audit.chain.event_hash, after _plain
    return json.dumps(covered, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def old_effect(effect: dict[str, Any]) -> str:  # tasks.transitions.ActionIntent.digest
    return json.dumps(effect, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def old_request(request: dict[str, Any]) -> str:  # tasks.services._request_digest
    return json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)


def old_payload(payload: Any) -> str:  # tasks.services._digest, tasks.checkpoints.encode
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))


def old_approval(value: Any) -> str:  # approvals.digest.canonical
    def text(value: str) -> str:
        return json.dumps(unicodedata.normalize("NFC", value), ensure_ascii=False)

    def number(value: int | float | Decimal) -> str:
        n = Decimal(str(value))
        if not n.is_finite():
            raise TypeError(f"cannot digest the number {value!r}")
        return "0" if n == 0 else format(n.normalize(), "f")

    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | Decimal):
        return number(value)
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        items = sorted((unicodedata.normalize("NFC", str(key)), item) for key, item in value.items())
        return "{" + ",".join(f"{text(key)}:{old_approval(item)}" for key, item in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(old_approval(item) for item in value) + "]"
    raise TypeError(f"cannot digest a {type(value).__name__}")


def outcome(encode, value) -> str | type[Exception]:
    try:
        return encode(value)
    except (TypeError, ValueError) as exc:
        return type(exc)


# Everything ``json.loads`` can give (and a JSONField or a JSON-mode model dump holds).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
approval_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.decimals() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


# --- every version -----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [V1, V1_ASCII, V2])
def test_keys_are_sorted_by_code_point_at_every_depth_and_there_is_no_whitespace(version):
    value = {"b": 1, "a": {"z": [1, 2], "B": None}, "é": True}
    assert canonical.dumps(value, version=version).encode("ascii", "replace") in (
        b'{"a":{"B":null,"z":[1,2]},"b":1,"?":true}',
        b'{"a":{"B":null,"z":[1,2]},"b":1,"\\u00e9":true}',
    )
    assert canonical.dumps({"a": 1, "b": 2}, version=version) == canonical.dumps(
        {"b": 2, "a": 1}, version=version
    )


@pytest.mark.parametrize("version", [V1, V1_ASCII, V2])
def test_the_digest_is_sha256_hex_of_the_utf8_text(version):
    value = {"objective": "Tasse cassée ☕", "n": 1}
    text = canonical.dumps(value, version=version)
    assert canonical.digest(value, version=version) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert canonical.digest_text(text) == hashlib.sha256(text.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("version", [V1, V1_ASCII, V2])
@pytest.mark.parametrize("value", [{1, 2}, b"x", object(), {"when": datetime(2026, 1, 1).date()}])
def test_a_value_without_a_form_is_refused(version, value):
    with pytest.raises(TypeError):
        canonical.dumps(value, version=version)


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="unknown canonical JSON version"):
        canonical.dumps({}, version="v3")


def test_the_module_imports_neither_django_nor_the_project():
    probe = (
        "import sys; import audit.canonical; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'django','tenancy','tasks','ledger','approvals','runtime','workflows','api','console','demo','config'}"
        " or m.startswith('audit.') and m != 'audit.canonical'); print(bad)"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- V1 and V1_ASCII ----------------------------------------------------------------------------------


def test_v1_writes_text_as_utf8_and_v1_ascii_escapes_it():
    value = {"reason": "Müller ☕"}
    assert canonical.dumps(value, version=V1) == '{"reason":"Müller ☕"}'
    assert canonical.dumps(value, version=V1_ASCII) == '{"reason":"M\\u00fcller \\u2615"}'
    assert canonical.dumps(value, version=V1_ASCII).isascii()


@pytest.mark.parametrize("version", [V1, V1_ASCII])
def test_v1_does_not_normalize_unicode(version):
    composed, decomposed = unicodedata.normalize("NFC", "Café"), unicodedata.normalize("NFD", "Café")
    assert canonical.digest(composed, version=version) != canonical.digest(decomposed, version=version)


@pytest.mark.parametrize("version", [V1, V1_ASCII])
def test_v1_writes_numbers_as_python_does_and_keeps_them_apart_from_strings(version):
    assert canonical.dumps([25, 25.0, 1e20, -0.0, "25"], version=version) == '[25,25.0,1e+20,-0.0,"25"]'
    assert canonical.dumps([float("nan"), float("inf")], version=version) == "[NaN,Infinity]"
    with pytest.raises(TypeError):
        canonical.dumps({"amount": Decimal("25.00")}, version=version)


@pytest.mark.parametrize("version", [V1, V1_ASCII])
def test_v1_writes_datetimes_in_utc_with_microseconds_at_any_depth(version):
    paris = WHEN.astimezone(timezone(timedelta(hours=1)))
    expected = '"2026-01-02T03:04:05.006000+00:00"'
    assert canonical.dumps(WHEN, version=version) == expected
    assert canonical.dumps(paris, version=version) == expected
    assert canonical.dumps({"a": [{"at": paris}]}, version=version) == '{"a":[{"at":' + expected + "}]}"
    whole = datetime(2026, 1, 2, tzinfo=UTC)
    assert canonical.dumps(whole, version=version) == '"2026-01-02T00:00:00.000000+00:00"'


@pytest.mark.parametrize("version", [V1, V1_ASCII])
def test_v1_writes_uuids_as_strings_and_tuples_as_lists(version):
    assert canonical.dumps({"id": ID, "ids": (ID,)}, version=version) == f'{{"id":"{ID}","ids":["{ID}"]}}'


@pytest.mark.parametrize("version", [V1, V1_ASCII])
def test_v1_refuses_keys_it_cannot_sort(version):
    with pytest.raises(TypeError):
        canonical.dumps({1: "a", "b": 2}, version=version)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_v1_is_the_old_chain_and_effect_encoding_for_every_json_value(value):
    assert outcome(lambda v: canonical.dumps(v, version=V1), value) == outcome(old_chain_body, value)
    assert outcome(lambda v: canonical.dumps(v, version=V1), value) == outcome(old_effect, value)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_v1_ascii_is_the_old_payload_body_and_request_encoding_for_every_json_value(value):
    # The request digest had ``default=str``; it only ever received JSON values (the input
    # model's JSON-mode dump, a str objective and task type, the deadline already a string),
    # for which ``default`` is never called: the same text, as this shows.
    new = outcome(lambda v: canonical.dumps(v, version=V1_ASCII), value)
    assert new == outcome(old_payload, value) == outcome(old_request, value)


ascii_text = st.text(alphabet=st.characters(max_codepoint=0x7E), max_size=5)


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | ascii_text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ascii_text, inner, max_size=3),
    )
)
def test_v1_and_v1_ascii_are_the_same_text_below_del(value):
    assert canonical.dumps(value, version=V1) == canonical.dumps(value, version=V1_ASCII)


def test_v1_ascii_escapes_del_and_v1_does_not():
    assert canonical.dumps("\x7f", version=V1) == '"\x7f"'
    assert canonical.dumps("\x7f", version=V1_ASCII) == '"\\u007f"'


# --- V2 ----------------------------------------------------------------------------------------------


def test_v2_normalizes_strings_and_keys_to_nfc():
    composed, decomposed = (
        unicodedata.normalize("NFC", "Café Müller"),
        unicodedata.normalize("NFD", "Café Müller"),
    )
    assert composed != decomposed
    assert canonical.dumps({decomposed: decomposed}, version=V2) == f'{{"{composed}":"{composed}"}}'


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (25, "25"),
        (25.0, "25"),
        (Decimal("25.00"), "25"),
        (Decimal("2.5E+1"), "25"),
        (1e20, "100000000000000000000"),
        (Decimal("1E+3"), "1000"),
        (0.1, "0.1"),
        (-0.0, "0"),
        (Decimal("-0.00"), "0"),
        (Decimal("10.50"), "10.5"),
    ],
)
def test_v2_writes_every_number_as_its_shortest_plain_decimal(number, text):
    assert canonical.dumps(number, version=V2) == text


def test_v2_keeps_a_number_a_string_and_a_boolean_apart():
    assert len({canonical.digest({"x": v}, version=V2) for v in (25, "25", 1, True)}) == 4


@pytest.mark.parametrize("value", [float("nan"), float("inf"), Decimal("NaN"), WHEN, ID])
def test_v2_refuses_non_finite_numbers_datetimes_and_uuids(value):
    with pytest.raises(TypeError):
        canonical.dumps({"x": value}, version=V2)


@settings(max_examples=300, deadline=None)
@given(approval_values)
def test_v2_is_the_old_approval_encoding(value):
    assert outcome(lambda v: canonical.dumps(v, version=V2), value) == outcome(old_approval, value)
    assert outcome(approval_digest.canonical, value) == outcome(old_approval, value)


# --- replay of stored values -------------------------------------------------------------------------


def stored_event_fields(event: dict[str, Any]) -> dict[str, Any]:
    """An event's hashed fields as the ORM hands them over: UUIDs and an aware datetime."""
    fields = {name: event[name] for name in (*HASHED_FIELDS, *OPTIONAL_HASHED_FIELDS)}
    fields["task_id"] = UUID(fields["task_id"])
    fields["parent_id"] = UUID(fields["parent_id"]) if fields["parent_id"] else None
    fields["created_at"] = datetime.fromisoformat(fields["created_at"])
    return fields


def test_the_fixture_holds_what_the_old_encoders_disagreed_on():
    # Otherwise a replay could pass with the wrong version at a site.
    assert len(STORED["chains"]) == 2 and all(len(c["events"]) > 1 for c in STORED["chains"])
    assert any(not e["reason"].isascii() for c in STORED["chains"] for e in c["events"])
    assert any("\\u" in c["body"] for c in STORED["checkpoints"])
    assert not STORED["task_requests"][0]["objective"].isascii()
    assert not STORED["task_inputs"][0]["payload"]["answer"].isascii()
    assert STORED["actions"] and STORED["approval_requests"]


@pytest.mark.parametrize("chain", STORED["chains"], ids=lambda c: c["task_id"])
def test_a_stored_chain_replays(chain):
    prev = GENESIS
    for event in chain["events"]:
        fields = stored_event_fields(event)
        covered = {name: fields[name] for name in HASHED_FIELDS}
        covered.update({name: fields[name] for name in OPTIONAL_HASHED_FIELDS if fields.get(name)})
        assert event["prev_hash"] == prev
        assert canonical.digest_text(prev + canonical.dumps(covered, version=V1)) == event["hash"]
        assert event_hash(prev, fields) == event["hash"]
        if not all(str(v).isascii() for v in covered.values()):
            assert canonical.digest_text(prev + canonical.dumps(covered, version=V1_ASCII)) != event["hash"]
        prev = event["hash"]
    assert prev == chain["audit_head"]
    events = [
        SimpleNamespace(**stored_event_fields(e), prev_hash=e["prev_hash"], hash=e["hash"])
        for e in chain["events"]
    ]
    broken = verify_events(
        UUID(chain["task_id"]), events, head=chain["audit_head"], state_version=len(events)
    )
    assert broken is None


@pytest.mark.parametrize("action", STORED["actions"], ids=lambda a: a["step"])
def test_a_stored_effect_digest_and_idempotency_key_replay(action):
    assert canonical.digest(action["effect"], version=V1) == action["effect_digest"]
    intent = ActionIntent(step=action["step"], connector=action["connector"], effect=action["effect"])
    assert intent.digest == action["effect_digest"]
    assert intent.idempotency_key(UUID(action["task_id"])) == action["idempotency_key"]


@pytest.mark.parametrize("request_", STORED["approval_requests"])
def test_a_stored_approval_digest_replays(request_):
    assert canonical.digest(request_["consequential"], version=V2) == request_["digest"]
    assert approval_digest.digest(request_["consequential"]) == request_["digest"]


@pytest.mark.parametrize("stored", STORED["checkpoints"], ids=lambda c: f"v{c['state_version']}")
def test_a_stored_checkpoint_body_and_digest_replay(stored):
    body = stored["body"]
    assert canonical.digest_text(body) == checkpoints.digest(body) == stored["digest"]
    assert canonical.dumps(json.loads(body), version=V1_ASCII) == body
    if "\\u" in body:
        assert canonical.dumps(json.loads(body), version=V1) != body
    # Read by today's code, a stored body comes back whole, migrated: what later schemas added is "unknown".
    original = json.loads(body)
    migrated = json.loads(checkpoints.encode(checkpoints.decode(body)))
    added = {"region": "", "ownership_epoch": 0} if original["schema_version"] < 3 else {}
    assert migrated == {**original, **added, "schema_version": checkpoints.CURRENT_SCHEMA}


@pytest.mark.parametrize("request_", STORED["task_requests"], ids=lambda r: r["objective"])
def test_a_stored_request_digest_replays(request_):
    deadline = datetime.fromisoformat(request_["deadline"]) if request_["deadline"] else None
    fields = {
        "task_type": request_["task_type"],
        "objective": request_["objective"],
        "input": request_["input"],
        "deadline": deadline.isoformat() if deadline else None,
    }
    assert canonical.digest(fields, version=V1_ASCII) == request_["request_digest"]
    if not request_["objective"].isascii():
        assert canonical.digest(fields, version=V1) != request_["request_digest"]
    digest = services._request_digest(
        request_["task_type"], request_["objective"], request_["input"], deadline
    )
    assert digest == request_["request_digest"]


@pytest.mark.parametrize("stored", STORED["task_inputs"])
def test_a_stored_input_payload_digest_replays(stored):
    assert canonical.digest(stored["payload"], version=V1_ASCII) == stored["payload_digest"]
    assert services._digest(stored["payload"]) == stored["payload_digest"]
    assert canonical.digest(stored["payload"], version=V1) != stored["payload_digest"]
