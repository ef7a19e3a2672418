"""Checking a signed audit export offline, with the anchor public key alone: stdlib and ``cryptography``.

An auditor outside the system holds neither the chain keys (``AUDIT_HMAC_KEYS``: whoever can check an
HMAC can also make one) nor the database. What they can hold is the anchor **public** key, which cannot
sign. So a JSON export (``audit.export.stream_json``) carries an Ed25519 signature by the anchor signing
key (``AUDIT_ANCHOR_KEY``) over its canonical content:

- every event carries ``digest``: SHA-256 (hex) of the event's canonical JSON without ``digest``
  (keys sorted, no whitespace, UTF-8: the chain's canonical V1 for plain JSON values);
- the signed digest is SHA-256 over ``canonical(header) + "\\n"``, then each event's ``digest + "\\n"``
  in file order, then ``"count:<n>\\n"``; the header is every top-level member except ``events``,
  ``count`` and ``signature``;
- the signature is Ed25519 over ``SIGNED_PREFIX + <that digest in hex>``, and its block names the
  key by fingerprint (first 16 hex digits of SHA-256 of the raw public key, as anchors do).

``verify(data, public_keys)`` checks, in order: the file parses (a line that does not is named, with
the event on it); each event's content against its ``digest`` (the first changed event is named by its
version); the signed digest and the signature with a trusted key (else ``signature``); and, for a task
export, the chain's shape (versions 1..n, each ``prev_hash`` the previous ``hash``, the last hash the
task's head) and what the system found when it verified the chain at export time.

Runs as a script too (``python audit/export_check.py FILE --public-key KEYFILE``; the same as
``scripts/verify_export.py`` and ``manage.py verify_export``): exit 0 and ``ok …`` for a valid file,
1 with what fails, 2 when the file or key cannot be read. It imports nothing from this project or
Django, so this one file can be handed to an auditor.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

FORMAT = "durable-agents/audit-export"
SIGNED_PREFIX = b"durable-agents/audit-export/v1\n"
GENESIS = "0" * 64
NOT_HEADER = ("events", "count", "signature")
DIGEST = "digest"


def canonical(value: Any) -> bytes:
    """Canonical JSON of plain JSON values: sorted keys, no whitespace, UTF-8 (canonical V1)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def event_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of an exported event's canonical JSON, its own ``digest`` left out."""
    return hashlib.sha256(canonical({k: v for k, v in record.items() if k != DIGEST})).hexdigest()


class Signed:
    """The running digest a signature covers: the header, each event's digest, the count."""

    def __init__(self, header: Mapping[str, Any]) -> None:
        self._sha = hashlib.sha256(canonical(dict(header)) + b"\n")
        self.count = 0

    def add(self, digest: str) -> None:
        self._sha.update(digest.encode() + b"\n")
        self.count += 1

    def hexdigest(self) -> str:
        final = self._sha.copy()
        final.update(f"count:{self.count}\n".encode())
        return final.hexdigest()


def message(hexdigest: str) -> bytes:
    """The bytes the Ed25519 signature is over."""
    return SIGNED_PREFIX + hexdigest.encode()


def fingerprint(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class KeyFileError(ValueError):
    """A public key file that holds no readable Ed25519 public key."""


def read_public_keys(text: str) -> dict[str, Ed25519PublicKey]:
    """Ed25519 public keys by fingerprint from ``text``: PEM blocks, and/or lines of base64 raw keys
    (``AUDIT_ANCHOR_PUBLIC_KEYS=a,b`` as printed by ``manage.py audit_anchor --public-key`` works too);
    ``#`` starts a comment line."""
    keys: dict[str, Ed25519PublicKey] = {}
    for block in re.findall(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", text, re.S):
        try:
            public = serialization.load_pem_public_key(block.encode())
        except ValueError as exc:
            raise KeyFileError(f"unreadable PEM public key: {exc}") from None
        if not isinstance(public, Ed25519PublicKey):
            raise KeyFileError("a PEM public key that is not Ed25519")
        keys[fingerprint(public)] = public
    without_pem = re.sub(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", "", text, flags=re.S)
    for line in without_pem.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("AUDIT_ANCHOR_PUBLIC_KEYS="):
            line = line.split("=", 1)[1]
        for part in filter(None, (p.strip() for p in line.split(","))):
            try:
                raw = base64.b64decode(part, validate=True)
                public = Ed25519PublicKey.from_public_bytes(raw)
            except (binascii.Error, ValueError):
                raise KeyFileError(f"not a base64 Ed25519 public key: {part[:20]!r}") from None
            keys[fingerprint(public)] = public
    if not keys:
        raise KeyFileError("no public key in the file")
    return keys


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    event: int | None = None  # the version of the event that fails, when one does
    signature: bool = False  # the signature block is what fails

    def __str__(self) -> str:
        return self.message


def _fail(text: str, *, event: int | None = None, signature: bool = False) -> Outcome:
    return Outcome(False, text, event, signature)


def _unparsable(data: bytes, error: json.JSONDecodeError) -> Outcome:
    """Name the line, and the event on it, of a file that is no longer JSON."""
    lines = data.decode("utf-8", "replace").splitlines()
    line = lines[error.lineno - 1] if 0 < error.lineno <= len(lines) else ""
    found = re.search(r'"state_version":\s*(\d+)', line)
    if found and error.lineno > 1:
        version = int(found.group(1))
        return _fail(f"event v{version} (line {error.lineno}) is not valid JSON: {error.msg}", event=version)
    return _fail(f"line {error.lineno} is not valid JSON: {error.msg}")


def _version(record: Any, position: int) -> int:
    value = record.get("state_version") if isinstance(record, dict) else None
    return value if isinstance(value, int) else position


def verify(data: bytes, public_keys: Mapping[str, Ed25519PublicKey]) -> Outcome:
    """Whether ``data`` is a signed audit export, unchanged, signed by one of ``public_keys``."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return _fail(f"not UTF-8 at byte {exc.start}")
    except json.JSONDecodeError as exc:
        return _unparsable(data, exc)
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        return _fail("not an audit export (no format durable-agents/audit-export)")
    events = document.get("events")
    if not isinstance(events, list):
        return _fail("no events list")
    header = {k: v for k, v in document.items() if k not in NOT_HEADER}
    signed = Signed(header)
    for position, record in enumerate(events, start=1):
        if not isinstance(record, dict) or record.get(DIGEST) != event_digest(record):
            version = _version(record, position)
            return _fail(
                f"event v{version} (#{position} in the file) does not match its digest: changed after export",
                event=version,
            )
        signed.add(record[DIGEST])
    if document.get("count") != len(events):
        return _fail(f"count says {document.get('count')!r}, the file holds {len(events)} events")
    problem = _signature_problem(document.get("signature"), signed.hexdigest(), public_keys)
    if problem:
        return _fail(f"signature: {problem}", signature=True)
    if document.get("kind") == "task":
        return _task_outcome(header, events)
    return Outcome(True, f"ok: {document.get('kind', 'export')} export, {len(events)} events, signed")


def _signature_problem(block: Any, digest: str, public_keys: Mapping[str, Ed25519PublicKey]) -> str | None:
    if not isinstance(block, dict):
        return "none: the export is not signed"
    if block.get("unsigned"):
        return f"none: {block['unsigned']}"
    key, claimed, value = block.get("key"), block.get("sha256"), block.get("value")
    if block.get("algorithm") != "ed25519" or not all(isinstance(v, str) for v in (key, claimed, value)):
        return "malformed signature block"
    if claimed != digest:
        return "the signed digest is not the file's (header, count or events changed, added or removed)"
    public = public_keys.get(str(key))
    if public is None:
        trusted = ", ".join(sorted(public_keys)) or "none"
        return f"signed by key {key}, which is not a key you trust (given: {trusted})"
    try:
        public.verify(base64.b64decode(str(value), validate=True), message(digest))
    except (InvalidSignature, binascii.Error, ValueError):
        return f"does not verify with key {key}"
    return None


def _task_outcome(header: Mapping[str, Any], events: Sequence[dict[str, Any]]) -> Outcome:
    """A task export's chain shape, checkable without the chain key, and what the system found."""
    task = header.get("task") or {}
    prev: Any = GENESIS
    for expected, record in enumerate(events, start=1):
        version = record.get("state_version")
        if version != expected:
            return _fail(f"event v{version}: expected v{expected} next (an event missing)", event=expected)
        if record.get("prev_hash") != prev:
            return _fail(f"event v{version}: prev_hash is not the previous event's hash", event=version)
        prev = record.get("hash")
    if len(events) != task.get("state_version") or prev != task.get("audit_head"):
        return _fail("the events do not end at the task's version and chain head the export names")
    chain = header.get("chain") or {}
    if chain.get("verified") is False:
        return _fail(
            f"signed, but the system found the chain broken when it exported it: {chain.get('problem')}",
            event=chain.get("version"),
        )
    return Outcome(True, f"ok: task {task.get('id')}, {len(events)} events, signed by {_signer(header)}")


def _signer(header: Mapping[str, Any]) -> str:
    return str((header.get("signing") or {}).get("key", "the anchor key"))


def check_file(path: Path, public_keys: Mapping[str, Ed25519PublicKey]) -> Outcome:
    return verify(path.read_bytes(), public_keys)


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Verify a signed audit export with the anchor public key (no chain key, no database)."
    )
    parser.add_argument("file", type=Path, help="the JSON export")
    parser.add_argument(
        "--public-key",
        type=Path,
        required=True,
        help="file with the anchor public key(s): PEM or base64 (manage.py audit_anchor --public-key)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:
        keys = read_public_keys(args.public_key.read_text())
        outcome = check_file(args.file, keys)
    except (OSError, KeyFileError) as exc:
        print(f"cannot read: {exc}", file=sys.stderr)
        return 2
    print(outcome.message, file=sys.stdout if outcome.ok else sys.stderr)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
