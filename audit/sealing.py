"""Sealed fields: sensitive values stored as envelopes, opened only where they are used.

A task type declares which facts (and input fields) are sensitive, and which
keys of each side effect (``tasks.registry``). Those values are stored as an
envelope::

    {"$sealed": "<key id>", "t": "<Fernet token>"}

The token encrypts the canonical JSON of ``{"at": <place>, "v": <value>}``.
The *place* names where the value belongs — ``["checkpoint", task id, state
version, "facts", "refund_card"]``, ``["action", idempotency key, "effect",
"card"]``, ``["task", task id, "input", "customer_email"]`` (also the task's
outcome, its input answers and external events: ``task_place``) or
``["approval", request id, "consequential", "effect", "card"]`` — and opening
checks it: a token copied into another row, version or field is refused, not
read as if it belonged there. (Fernet has no associated
data, so the place travels inside the ciphertext and is compared on the way out.)

Keys come from ``FIELD_ENCRYPTION_KEYS`` (``"id:key,id2:key2"``, each key a
urlsafe-base64 Fernet key) and never from the database. A ``MultiFernet``
holds them in order: the first seals everything new; opening uses the key the
envelope names, so a value under a retired key is reported by that key's id
(``key_missing``) rather than as a generic failure. Without the setting a
public development key is used, but only with ``DEBUG`` on or under the test
runner; elsewhere a deployment whose task types mark fields sensitive refuses
to start (``check_configuration``, called when the task types are loaded).

Rotation re-seals a token under the first key without looking at the value's
place or meaning: the plaintext (place included) is carried over as it is, so
rotating can never move a value, and what could not be opened before cannot be
opened after.

Integrity: a checkpoint's digest (``tasks.checkpoints.digest``) is taken over
its body with each envelope reduced to ``{"$sealed":""}`` (``blank``), so
re-sealing under another key leaves the digest — and the audit chain that
recorded it — unchanged. The ciphertext is vouched for by Fernet's own HMAC
and the place inside it; everything around it by the digest.

Errors never quote a value or a token: only where it sits and the key id.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections import Counter
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Model

from audit import canonical
from audit.keys import dev_keys_allowed  # the chain's rule: DEBUG on or under pytest

MARK = "$sealed"
TOKEN = "t"
# A place: the path of a value, from the row that holds it down to its key.
Place = tuple[str | int, ...]

KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
# An envelope as it appears in JSON text this code wrote (keys in canonical order; whitespace allowed
# so that a body re-spaced by other code is still recognised). Inside a JSON string every quote is
# escaped, so this can only ever match a real object, never text a user typed.
ENVELOPE_TEXT = re.compile(
    r'\{\s*"\$sealed"\s*:\s*"([A-Za-z0-9_-]{1,32})"\s*,\s*"t"\s*:\s*"([A-Za-z0-9_=-]*)"\s*\}'
)
BLANKED = '{"$sealed":""}'
# Public, so worthless as a secret: the demo's and the tests' key, never used with DEBUG off.
DEV_KEYS = (
    "dev:" + base64.urlsafe_b64encode(hashlib.sha256(b"durable-agent dev-only field key").digest()).decode()
)
# What a model is shown instead of a sensitive value (nothing of the value, not even its tail).
MODEL_MASK = "[sealed]"
# Shown for a sealed value this process cannot open (its key is not held).
UNOPENED_MASK = "[sealed]"
# The key id of an erased value (``erase_text``): no key has it, so nothing can open it again.
ERASED = "erased"


class Unopenable(Exception):
    """A sealed value this process cannot open. ``problem`` is one of the class constants."""

    KEY_MISSING = "key_missing"  # the envelope's key id is not in FIELD_ENCRYPTION_KEYS (retired, removed)
    TOKEN_INVALID = "token_invalid"  # the token does not verify under that key (tampered, or another key)
    MISPLACED = "misplaced"  # it verifies, but was sealed for another row, version or field
    MALFORMED = "malformed"  # not an envelope this code writes
    ERASED = "erased"  # deliberately emptied (retention): the value is gone

    def __init__(self, problem: str, *, key_id: str, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.problem = problem
        self.key_id = key_id
        self.where = where


# --- keys --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Keyring:
    """The configured keys: ``primary`` seals, every one of ``keys`` opens what names it."""

    primary: str
    keys: Mapping[str, Fernet]
    writer: MultiFernet  # the keys, primary first: MultiFernet encrypts with the first

    def seal_bytes(self, plain: bytes) -> str:
        return self.writer.encrypt(plain).decode()

    def open_bytes(self, key_id: str, token: str, where: str) -> bytes:
        if key_id == ERASED:
            raise Unopenable(Unopenable.ERASED, key_id=key_id, where=where, message="the value was erased")
        key = self.keys.get(key_id)
        if key is None:
            raise Unopenable(
                Unopenable.KEY_MISSING,
                key_id=key_id,
                where=where,
                message=f"sealed under key {key_id!r}, which FIELD_ENCRYPTION_KEYS no longer holds",
            )
        try:
            return key.decrypt(token.encode())
        except InvalidToken:
            raise Unopenable(
                Unopenable.TOKEN_INVALID,
                key_id=key_id,
                where=where,
                message=f"the token does not verify under key {key_id!r} (altered, or another key's)",
            ) from None


def parse_keys(text: str) -> Keyring:
    """``"id:key,id2:key2"`` as a ``Keyring``. Raises ``ImproperlyConfigured`` naming the bad entry
    (by position and id, never the key)."""
    keys: dict[str, Fernet] = {}
    entries = [part.strip() for part in text.split(",") if part.strip()]
    if not entries:
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEYS holds no key")
    for position, entry in enumerate(entries, start=1):
        key_id, colon, secret = entry.partition(":")
        key_id = key_id.strip()
        if not colon or not KEY_ID.fullmatch(key_id):
            raise ImproperlyConfigured(
                f"FIELD_ENCRYPTION_KEYS entry {position} is not 'id:key' with an id of letters, digits, "
                "'_' or '-' (at most 32)"
            )
        if key_id in keys or key_id == ERASED:
            raise ImproperlyConfigured(f"FIELD_ENCRYPTION_KEYS names key {key_id!r} twice, or a reserved id")
        try:
            keys[key_id] = Fernet(secret.strip().encode())
        except (ValueError, binascii.Error):
            raise ImproperlyConfigured(
                f"FIELD_ENCRYPTION_KEYS key {key_id!r} is not a Fernet key (32 bytes, urlsafe base64; "
                "make one with `python -c 'from cryptography.fernet import Fernet; "
                "print(Fernet.generate_key().decode())'`)"
            ) from None
    primary = next(iter(keys))
    return Keyring(primary, keys, MultiFernet(list(keys.values())))


@cache
def _keyring_for(text: str) -> Keyring:
    return parse_keys(text)


def configured_keys() -> str:
    text: str = getattr(settings, "FIELD_ENCRYPTION_KEYS", "") or ""
    return text.strip()


def keyring() -> Keyring:
    """The process's keys (parsed once per distinct setting, so tests may switch keys).

    Raises ``ImproperlyConfigured`` when none are configured outside DEBUG and tests.
    """
    text = configured_keys() or (DEV_KEYS if dev_keys_allowed() else "")
    if not text:
        raise ImproperlyConfigured("FIELD_ENCRYPTION_KEYS is not set: sensitive fields cannot be sealed")
    return _keyring_for(text)


def check_configuration(needed_by: Collection[str]) -> None:
    """At start-up: refuse malformed keys always, and missing keys when the task types ``needed_by``
    mark fields sensitive (outside DEBUG and tests, where the development key stands in)."""
    text = configured_keys()
    if text:
        _keyring_for(text)
    elif needed_by and not dev_keys_allowed():
        raise ImproperlyConfigured(
            f"FIELD_ENCRYPTION_KEYS is not set, and task types {', '.join(sorted(needed_by))} mark fields "
            "sensitive: set it to 'id:key' (see docs/operating/field-encryption.md)"
        )


# --- one value ---------------------------------------------------------------------------------------


def is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and MARK in value


def _where(at: Place) -> str:
    return ".".join(str(part) for part in at)


def _shape(envelope: Any, where: str) -> tuple[str, str]:
    """(key id, token) of a well-formed envelope; ``Unopenable(MALFORMED)`` otherwise."""
    if isinstance(envelope, dict) and set(envelope) == {MARK, TOKEN}:
        key_id, token = envelope[MARK], envelope[TOKEN]
        if isinstance(key_id, str) and isinstance(token, str) and KEY_ID.fullmatch(key_id):
            return key_id, token
    raise Unopenable(
        Unopenable.MALFORMED,
        key_id="",
        where=where,
        message='not an envelope {"$sealed": <key id>, "t": <token>}',
    )


def seal(value: Any, at: Place, ring: Keyring | None = None) -> dict[str, str]:
    """The envelope of ``value`` (any JSON value) bound to place ``at``, under the primary key."""
    ring = ring or keyring()
    plain = canonical.dumps({"at": list(at), "v": value}, version=canonical.V1).encode()
    return {MARK: ring.primary, TOKEN: ring.seal_bytes(plain)}


def open_envelope(envelope: Any, at: Place, ring: Keyring | None = None, *, where: str = "") -> Any:
    """The value sealed in ``envelope``, which must have been sealed for place ``at``.

    Raises ``Unopenable`` (malformed, key missing, token invalid, misplaced); ``where`` is how its
    message names the place (default: all of it).
    """
    where = where or _where(at)
    key_id, token = _shape(envelope, where)
    plain = (ring or keyring()).open_bytes(key_id, token, where)
    try:
        document = json.loads(plain)
        sealed_at, value = document["at"], document["v"]
    except (ValueError, TypeError, KeyError):
        raise Unopenable(
            Unopenable.MALFORMED, key_id=key_id, where=where, message="the sealed content is not a value"
        ) from None
    if sealed_at != list(at):
        raise Unopenable(
            Unopenable.MISPLACED,
            key_id=key_id,
            where=where,
            message=f"the token under key {key_id!r} was sealed for another task, version or field",
        )
    return value


def reseal(envelope: Any, ring: Keyring, where: str = "") -> dict[str, str] | None:
    """``envelope`` re-sealed under the primary key, its plaintext (place included) unchanged;
    None when it is under the primary key already, or erased. Raises ``Unopenable`` when it cannot be
    opened."""
    key_id, token = _shape(envelope, where)
    if key_id in (ring.primary, ERASED):
        return None
    plain = ring.open_bytes(key_id, token, where)
    return {MARK: ring.primary, TOKEN: ring.seal_bytes(plain)}


# --- JSON documents ------------------------------------------------------------------------------------


def action_place(idempotency_key: str) -> Place:
    """Where an action's sealed effect values belong: its ledger row, by its idempotency key."""
    return ("action", idempotency_key)


def task_place(task_id: Any, *path: str | int) -> Place:
    """Where a sealed value in a task's own rows belongs: the task, then the column and the row within it.

    ``task_place(id, "input")`` and ``task_place(id, "outcome")`` for the task's columns;
    ``task_place(id, "inputs", version, "payload")`` for the answer to the wait at that version;
    ``task_place(id, "events", event_key, "payload")`` for an external event. A field's key follows.
    """
    return ("task", str(task_id), *path)


def approval_place(request_id: Any, column: str) -> Place:
    """Where a sealed value of an approval request belongs: the request, then its column
    (``consequential`` or ``material``)."""
    return ("approval", str(request_id), column)


def open_effect(idempotency_key: str, effect: Any) -> Any:
    """An action's effect as it is to be sent: every sealed value opened (``Unopenable`` if one cannot)."""
    return open_all(effect, (*action_place(idempotency_key), "effect"))


def masked_effect(idempotency_key: str, effect: Any, names: Collection[str] = ()) -> Any:
    """An action's effect as pages and API answers show it: sealed values masked, and so are the keys in
    ``names`` still held in clear (a row written before its step marked them sensitive)."""
    return masked_at(effect, (*action_place(idempotency_key), "effect"), names)


def masked_at(value: Any, at: Place, names: Collection[str] = ()) -> Any:
    """``value`` (sealed at ``at``) as pages and API answers show it: every sealed value masked, and so
    are the keys in ``names`` still held in clear (a row written before they were sealed)."""
    shown = mask_all(value, at)
    if not names or not isinstance(value, dict) or not isinstance(shown, dict):
        return shown
    return {
        key: mask(item) if key in names and not is_envelope(value.get(key)) else item
        for key, item in shown.items()
    }


def seal_fields(mapping: Mapping[str, Any], names: Collection[str], at: Place) -> dict[str, Any]:
    """``mapping`` with each key in ``names`` sealed at ``(*at, key)``; None and "" stay as they are
    (there is nothing in them to hide), and so does a value sealed already."""
    ring = keyring() if any(_worth_sealing(mapping.get(name)) for name in names) else None
    return {
        key: seal(value, (*at, key), ring) if key in names and _worth_sealing(value) else value
        for key, value in mapping.items()
    }


def _worth_sealing(value: Any) -> bool:
    return value is not None and value != "" and not is_envelope(value)


def _walk(value: Any, at: Place) -> Iterator[tuple[Place, Any]]:
    """Every envelope in ``value`` (parsed JSON) with its place."""
    if is_envelope(value):
        yield at, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, (*at, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*at, index))


def _replace(value: Any, at: Place, change: Any) -> Any:
    """``value`` with every envelope replaced by ``change(place, envelope)``."""
    if is_envelope(value):
        return change(at, value)
    if isinstance(value, dict):
        return {key: _replace(item, (*at, key), change) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace(item, (*at, index), change) for index, item in enumerate(value)]
    return value


def open_all(value: Any, at: Place, ring: Keyring | None = None) -> Any:
    """``value`` (parsed JSON) with every envelope, at any depth, opened and checked against its place
    (``at`` followed by its path). Raises ``Unopenable`` for the first that cannot be."""
    if not any(True for _ in _walk(value, at)):
        return value
    ring = ring or keyring()

    def opened(place: Place, envelope: Any) -> Any:
        return open_envelope(envelope, place, ring, where=_where(place[len(at) :]))

    return _replace(value, at, opened)


def mask_all(value: Any, at: Place, ring: Keyring | None = None) -> Any:
    """``value`` with every envelope shown masked (``mask`` of what it holds; ``[sealed]`` if it
    cannot be opened here)."""

    def shown(place: Place, envelope: Any) -> Any:
        try:
            return mask(open_envelope(envelope, place, ring))
        except Unopenable as exc:
            return "[erased]" if exc.problem == Unopenable.ERASED else UNOPENED_MASK
        except ImproperlyConfigured:
            return UNOPENED_MASK

    return _replace(value, at, shown)


def key_ids(value: Any) -> Counter[str]:
    """How many envelopes in ``value`` (parsed JSON) are under each key id."""
    return Counter(
        envelope.get(MARK) if isinstance(envelope.get(MARK), str) else "?" for _, envelope in _walk(value, ())
    )


@dataclass
class Rotated:
    """What re-sealing one document did: its new form, and counts per key id."""

    value: Any
    resealed: Counter[str] = field(default_factory=Counter)  # old key id -> envelopes re-sealed
    left: Counter[str] = field(default_factory=Counter)  # key id -> envelopes that could not be opened

    @property
    def changed(self) -> bool:
        return bool(self.resealed)


def rotate_all(value: Any, ring: Keyring) -> Rotated:
    """``value`` (parsed JSON) with every envelope not under the primary key re-sealed under it."""
    result = Rotated(value)

    def rotate(place: Place, envelope: Any) -> Any:
        try:
            fresh = reseal(envelope, ring, _where(place))
        except Unopenable as exc:
            result.left[exc.key_id or "?"] += 1
            return envelope
        if fresh is None:
            return envelope
        result.resealed[envelope[MARK]] += 1
        return fresh

    result.value = _replace(value, (), rotate)
    return result


# --- JSON columns of the layers above ------------------------------------------------------------------

# JSON columns of apps above the kernel that hold sealed values, by label: ``manage.py rotate_keys``
# (``protection.rotation``) re-seals them with the kernel's and the ledger's own. Each app names its
# columns when it is ready (``approvals.apps``), since nothing here may import its models.
_JSON_COLUMNS: dict[str, tuple[type[Model], str]] = {}


def register_json_column(label: str, model: type[Model], column: str) -> None:
    _JSON_COLUMNS[label] = (model, column)


def json_columns() -> dict[str, tuple[type[Model], str]]:
    """The registered columns, by label, in the order they were registered."""
    return dict(_JSON_COLUMNS)


# --- JSON text (checkpoint bodies) ---------------------------------------------------------------------


def has_envelopes(text: str) -> bool:
    return f'"{MARK}"' in text and ENVELOPE_TEXT.search(text) is not None


def blank(text: str) -> str:
    """``text`` with every envelope reduced to ``{"$sealed":""}``: what a digest is taken over, so that
    re-sealing (another key, a fresh token) leaves it unchanged while every other byte still counts."""
    if f'"{MARK}"' not in text:
        return text
    return ENVELOPE_TEXT.sub(BLANKED, text)


def erase_text(text: str) -> str:
    """``text`` with every sealed value erased in place (``{"$sealed":"erased","t":""}``): for retention.

    The ``blank`` form is unchanged, so a checkpoint's digest and its audit chain still verify after
    its sensitive values are gone; nothing can open an erased value (``Unopenable.ERASED``), so no
    task resumes from one (a worker quarantines it as ``checkpoint_undecryptable``).
    """
    return ENVELOPE_TEXT.sub(json.dumps({MARK: ERASED, TOKEN: ""}, separators=(",", ":")), text)


def key_ids_in_text(text: str) -> Counter[str]:
    return Counter(match.group(1) for match in ENVELOPE_TEXT.finditer(text))


def rotate_text(text: str, ring: Keyring) -> Rotated:
    """``text`` with every envelope not under the primary key re-sealed in place; every other byte kept,
    so its ``blank`` form — and the digest over it — does not change."""
    result = Rotated(text)

    def rotate(match: re.Match[str]) -> str:
        key_id, token = match.group(1), match.group(2)
        try:
            fresh = reseal({MARK: key_id, TOKEN: token}, ring)
        except Unopenable:
            result.left[key_id] += 1
            return match.group(0)
        if fresh is None:
            return match.group(0)
        result.resealed[key_id] += 1
        # Written back as canonical JSON writes it (the blank form does not depend on the spacing).
        return json.dumps(fresh, separators=(",", ":"))

    result.value = ENVELOPE_TEXT.sub(rotate, text)
    return result


# --- masking -------------------------------------------------------------------------------------------


def mask(value: Any) -> Any:
    """How a sensitive value is shown without revealing it: ``•••• 1881`` when it ends in four digits
    (a card, an account, a phone number: the tail people recognise), ``••••`` otherwise. None and ""
    stay as they are: there is nothing in them to hide."""
    if value is None or value == "":
        return value
    text = str(value)
    tail = text[-4:]
    if len(text) >= 8 and tail.isascii() and tail.isdigit():
        return f"•••• {tail}"
    return "••••"


def masked(mapping: Mapping[str, Any], names: Collection[str]) -> dict[str, Any]:
    """``mapping`` with the values under ``names`` masked (an envelope shown as ``[sealed]``)."""
    return {
        key: (UNOPENED_MASK if is_envelope(value) else mask(value)) if key in names else value
        for key, value in mapping.items()
    }
