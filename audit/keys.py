"""The secrets behind tamper evidence: read from settings (the environment), never from the database.

``AUDIT_HMAC_KEYS`` — ``"id:secret,id2:secret2"``: the keys of the audit
chain (``audit.chain``). The first is current: new events are written with
it and record its id. Every listed key verifies. Rotation is adding a new id
in front and keeping the old ones for as long as events written with them
exist (an event whose key id is not listed is reported as a break). Ids are
1-32 characters of ``A-Z a-z 0-9 _ . -``; secrets are at least 32 characters
and cannot contain a comma.

``AUDIT_ANCHOR_KEY`` — the Ed25519 private key that signs anchors
(``audit.anchor``): its 32-byte seed, base64. ``AUDIT_ANCHOR_PUBLIC_KEYS`` —
more public keys (base64, comma-separated) whose anchors are trusted: earlier
keys after a rotation, or, on a host that only verifies, the signer's key
with no private key at all. ``manage.py audit_anchor --generate-key`` prints
a new pair.

Unset, public development keys stand in, but only with ``DEBUG`` on or under
pytest (as for ``FIELD_ENCRYPTION_KEYS``, ``audit.sealing``); otherwise an
unset key stops the first write (or anchor, or verification) with
``ImproperlyConfigured`` naming the variable, and ``manage.py check --deploy``
reports it up front. A malformed value stops start-up (``audit.apps``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from audit import export_check
from audit.chain import keyed_hash

KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,32}")
MIN_SECRET_CHARS = 32
# Public, so worthless as secrets: the demo's and the tests' keys, never used with DEBUG off.
DEV_CHAIN_KEYS = "dev:dev-only-insecure-audit-chain-key-0000000000"
DEV_ANCHOR_KEY = base64.b64encode(hashlib.sha256(b"dev-only-insecure-audit-anchor-key").digest()).decode()


def dev_keys_allowed() -> bool:
    """Development keys stand in only with DEBUG on or under pytest (which turns DEBUG off in tests)."""
    return bool(settings.DEBUG) or "pytest" in sys.modules


def _setting(name: str, dev_default: str) -> str:
    text = str(getattr(settings, name, "") or "").strip()
    return text or (dev_default if dev_keys_allowed() else "")


@dataclass(frozen=True)
class ChainKey:
    id: str
    secret: bytes = b""

    def __repr__(self) -> str:  # never print a secret by accident
        return f"ChainKey({self.id!r})"


@lru_cache(maxsize=8)
def parse_chain_keys(text: str) -> tuple[ChainKey, ...]:
    """The keys in an ``AUDIT_HMAC_KEYS`` value, current first; ``ImproperlyConfigured`` if malformed."""
    keys: list[ChainKey] = []
    for n, entry in enumerate(part.strip() for part in text.split(",")):
        key_id, sep, secret = entry.partition(":")
        if not sep or not KEY_ID.fullmatch(key_id):
            raise ImproperlyConfigured(
                f"AUDIT_HMAC_KEYS entry {n + 1} must be 'id:secret' with an id of 1-32 characters "
                "of A-Z a-z 0-9 _ . -"
            )
        if len(secret) < MIN_SECRET_CHARS:
            raise ImproperlyConfigured(
                f"AUDIT_HMAC_KEYS key {key_id!r}: the secret must be at least {MIN_SECRET_CHARS} characters"
            )
        if any(key.id == key_id for key in keys):
            raise ImproperlyConfigured(f"AUDIT_HMAC_KEYS lists key id {key_id!r} twice")
        keys.append(ChainKey(key_id, secret.encode()))
    return tuple(keys)


def _configured_chain_keys() -> tuple[ChainKey, ...]:
    text = _setting("AUDIT_HMAC_KEYS", DEV_CHAIN_KEYS)
    if not text:
        raise ImproperlyConfigured(
            "AUDIT_HMAC_KEYS is not set: the audit chain needs a key from the environment "
            "('id:secret', secret of 32+ characters; see docs/operating/tamper-evidence.md)"
        )
    return parse_chain_keys(text)


def chain_keys() -> dict[str, bytes]:
    """Every configured chain key by id, the current one first (what verification accepts)."""
    return {key.id: key.secret for key in _configured_chain_keys()}


def current_chain_key() -> ChainKey:
    """The key new events are written with: the first of ``AUDIT_HMAC_KEYS``."""
    return _configured_chain_keys()[0]


def chain_link(prev_hash: str, fields: Mapping[str, Any]) -> tuple[str, str]:
    """``(key_id, hash)`` for a new event linking to ``prev_hash``, under the current chain key."""
    key = current_chain_key()
    return key.id, keyed_hash(prev_hash, fields, key.secret)


# --- Anchor signing keys ------------------------------------------------------------------------


def _decoded(text: str, name: str) -> bytes:
    try:
        raw = base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ImproperlyConfigured(f"{name}: not base64") from None
    if len(raw) != 32:
        raise ImproperlyConfigured(f"{name}: an Ed25519 key is 32 bytes, this is {len(raw)}")
    return raw


# A public key's id in anchor files and signed exports: the first 16 hex digits of SHA-256 of its raw
# bytes (defined with the offline export check, which must not import this module).
fingerprint = export_check.fingerprint


def encode_private(private: Ed25519PrivateKey) -> str:
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return base64.b64encode(raw).decode()


def encode_public(public: Ed25519PublicKey) -> str:
    return base64.b64encode(
        public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    ).decode()


def anchor_signing_key() -> Ed25519PrivateKey:
    """The private key ``audit_anchor`` signs with (``AUDIT_ANCHOR_KEY``)."""
    text = _setting("AUDIT_ANCHOR_KEY", DEV_ANCHOR_KEY)
    if not text:
        raise ImproperlyConfigured(
            "AUDIT_ANCHOR_KEY is not set: anchors are signed with an Ed25519 key from the environment "
            "(manage.py audit_anchor --generate-key prints one)"
        )
    return Ed25519PrivateKey.from_private_bytes(_decoded(text, "AUDIT_ANCHOR_KEY"))


def held_signing_key() -> Ed25519PrivateKey | None:
    """The anchor signing key if this process holds one (the ``audit`` worker, a single-host or demo
    deployment), else None: web hosts normally hold only the public keys (docs/operating/workers.md)."""
    try:
        return anchor_signing_key()
    except ImproperlyConfigured:
        return None


def export_signing_key() -> Ed25519PrivateKey | None:
    """What signs a history export (``audit.export``): ``AUDIT_EXPORT_KEY`` where it is set (a web host,
    which must not hold the anchor key), else the anchor key if this host holds it, else None (the export
    says it is unsigned). An export key vouches for what the web tier read from the database, as the chain
    key it also holds does; the anchor key, which vouches for the chain heads outside it, stays away."""
    text = str(getattr(settings, "AUDIT_EXPORT_KEY", "") or "").strip()
    if text:
        return Ed25519PrivateKey.from_private_bytes(_decoded(text, "AUDIT_EXPORT_KEY"))
    return held_signing_key()


def anchor_public_keys() -> dict[str, Ed25519PublicKey]:
    """Every public key whose anchors are trusted, by fingerprint: the signer's own and
    ``AUDIT_ANCHOR_PUBLIC_KEYS``. ``ImproperlyConfigured`` when there is none at all."""
    trusted: dict[str, Ed25519PublicKey] = {}
    if _setting("AUDIT_ANCHOR_KEY", DEV_ANCHOR_KEY):
        public = anchor_signing_key().public_key()
        trusted[fingerprint(public)] = public
    for n, text in enumerate(getattr(settings, "AUDIT_ANCHOR_PUBLIC_KEYS", ()) or ()):
        if text.strip():
            public = Ed25519PublicKey.from_public_bytes(
                _decoded(text, f"AUDIT_ANCHOR_PUBLIC_KEYS entry {n + 1}")
            )
            trusted[fingerprint(public)] = public
    if not trusted:
        raise ImproperlyConfigured(
            "neither AUDIT_ANCHOR_KEY nor AUDIT_ANCHOR_PUBLIC_KEYS is set: no anchor can be verified"
        )
    return trusted


def export_public_keys() -> dict[str, Ed25519PublicKey]:
    """The public keys a signed export verifies under on this host: the anchor keys, and the export key's
    when ``AUDIT_EXPORT_KEY`` is set. What ``audit_anchor --public-key`` prints and ``verify_export``
    trusts when given no key file."""
    trusted = dict(anchor_public_keys())
    signer = export_signing_key()
    if signer is not None:
        trusted[fingerprint(signer.public_key())] = signer.public_key()
    return trusted


def configuration_problems() -> tuple[list[str], list[str]]:
    """``(missing, malformed)``: what is wrong with the tamper-evidence keys, as messages.

    Missing keys matter for a deployment (``check --deploy``); a malformed value is wrong anywhere.
    """
    missing: list[str] = []
    malformed: list[str] = []
    for read, names in (
        (_configured_chain_keys, ("AUDIT_HMAC_KEYS",)),
        (anchor_public_keys, ("AUDIT_ANCHOR_KEY", "AUDIT_ANCHOR_PUBLIC_KEYS")),
        (export_signing_key, ("AUDIT_EXPORT_KEY",)),
    ):
        try:
            read()
        except (ImproperlyConfigured, ValueError) as exc:
            unset = not any(_setting(name, "") for name in names)
            (missing if unset else malformed).append(str(exc))
    return missing, malformed
