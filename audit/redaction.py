"""One redaction function for every text that leaves the process or is kept for good.

Exception messages become audit reasons (append-only: a secret written there
stays forever), ledger errors, log lines and span attributes. Each of those
exits passes its text through ``redact``, which removes:

- the user-info of a URL (``https://svc:pw@host`` -> ``https://***@host``), also written
  with one slash (``https:/svc:pw@host``), JSON-escaped (``https:\\/\\/``) or percent-encoded
  (``https%3A%2F%2Fsvc%3Apw%40host``, a URL inside a query string);
- the value of an ``Authorization`` header and of a bare ``Bearer``/``Token``/
  ``Basic`` credential;
- the value of a ``key=value``, ``key: value`` or ``"key": "value"`` pair whose
  key names a secret (password, token, api_key, cookie, session, ...) or a field
  a task type marked sensitive (``register_sensitive_fields``);
- the value of a query-string parameter named like a secret, including names that say it
  only briefly (``?sig=``, ``&key=``, ``auth``, ``jwt``, ``pwd``: ``QUERY_SECRET_NAMES``) and
  signed-URL parameters (``X-Amz-Signature``, ``X-Amz-Credential``);
- card numbers (13–19 digits, spaced or dashed, with a card's first digits and a valid Luhn
  checksum), but their last four (``***1111``), and the mailbox of an e-mail address
  (``***@example.com``): what a connector's system answered may quote the customer's;
- the exact value of every secret this deployment is configured with (connector
  tokens and headers, the model's API key, the sandbox token, ``SECRET_KEY``,
  the field-encryption and audit keys, the database password), wherever it
  appears, even in free text.

``redact_value`` does the same for structured data (mappings and lists):
values under a secret-looking or sensitive key are masked whole.

This module sits in the lowest layer so that every other one may use it. It
reads settings lazily and caches what it compiled until a setting changes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any
from urllib.parse import quote

from django.conf import settings
from django.core.signals import setting_changed

MASK = "***"

# A key "names a secret" when it contains one of these (case-insensitive): api_key, X-Api-Key,
# client_secret, refresh_token, sessionid, csrftoken, Set-Cookie, DB_PASSWORD...
_SECRET_WORD = (
    r"(?:password|passwd|passphrase|secret|token|api[-_]?key|access[-_]?key|private[-_]?key"
    r"|authorization|cookie|session|signature|credential)"
)
_SECRET_KEY_RE = re.compile(_SECRET_WORD, re.IGNORECASE)

# scheme://user:password@host -> scheme://***@host. The user-info ends at the last "@" before
# the path, so a password holding a raw "@" is still removed whole.
# One slash or two, each maybe JSON-escaped ("https:\/\/"): a client library's message or a
# JSON body quoting the URL. A backslash ends the user-info, so an escaped path is not taken in.
_USERINFO_RE = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*:(?:\\?/){1,2})[^\s/?#\"'<>\\]+@")
# Percent-encoded (a URL passed in another's query string): up to the first %40, not past a %2F.
_ENCODED_USERINFO_RE = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*%3A(?:%2F){1,2})(?:(?!%2F)[^\s/?#&\"'<>\\])+?%40", re.IGNORECASE
)
# A query parameter (after ?, & or ;) whose exact name is a credential, though the name does not
# say "token" or "secret": these are only masked in a query string, where the name is a name.
QUERY_SECRET_NAMES = frozenset({"key", "sig", "auth", "pass", "pwd", "jwt", "otp", "code_verifier"})
_QUERY_PARAM_RE = re.compile(r"(?<=[?&;])(?P<key>[\w.-]+)=(?P<value>[^&#;\s\"'<>]+)")
# A card number: 13–19 digits, maybe grouped by spaces or dashes (Luhn and first digits checked).
_CARD_RE = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
# An e-mail address: its mailbox (before the @) is masked, its domain kept.
_EMAIL_RE = re.compile(r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@(?=(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}\b)")
# A credential after its scheme with no key in front ("... sent Bearer abc.def"). "Bearer" in any
# case; "Token" and "Basic" only capitalised as in a header, so that prose like "token bucket" stays.
_SCHEME_RE = re.compile(r"\b(?P<scheme>(?i:bearer)|Token|Basic)(?P<gap>\s+)[A-Za-z0-9._~+/=:-]+")

_QUOTED_VALUE = r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'"
# "key": value and 'key': value (JSON, Python reprs). Which keys are secret is decided per match.
_QUOTED_PAIR_RE = re.compile(
    rf"(?P<q>[\"'])(?P<key>[\w.-]++)(?P=q)\s*+:\s*+(?=(?P<value>{_QUOTED_VALUE}|[^\s,}}\]]+))"
)
# key=value and key: value (query strings, headers, log fields). A header value may start with its
# scheme ("Authorization: Bearer abc"): one value, masked whole.
_PLAIN_PAIR_RE = re.compile(
    r"(?<![\w.-])(?P<key>[\w.-]++)\s*+[=:]\s*+"
    rf"(?=(?P<value>(?:(?i:bearer|token|basic|digest)\s+)?(?:{_QUOTED_VALUE}|[^\s,;&\"'}}\])]+)))"
)

# Settings holding secrets (a string, a list of them, or a mapping whose values are).
_SECRET_SETTINGS = (
    "SECRET_KEY",
    "SECRET_KEY_FALLBACKS",
    "MODEL_API_KEY",
    "SANDBOX_TOKEN",
    "CONNECTOR_TOKENS",
    "CONNECTOR_HEADERS",
    "FIELD_ENCRYPTION_KEYS",
    "METRICS_TOKEN",
)
# Shorter configured values are not searched for in free text: they would mask ordinary words.
MIN_SECRET_LENGTH = 8

_lock = threading.Lock()
_sensitive: frozenset[str] = frozenset()


def register_sensitive_fields(names: Iterable[str]) -> None:
    """Mark field names (e.g. ``refund_card``) whose values ``redact`` and ``redact_value`` mask."""
    global _sensitive
    with _lock:
        _sensitive = _sensitive | frozenset(name for name in names if name)


def sensitive_fields() -> frozenset[str]:
    return _sensitive


def is_secret_key(key: str) -> bool:
    """True when a key's name says its value is a credential."""
    return _SECRET_KEY_RE.search(key) is not None


def _mask_pairs(pattern: re.Pattern[str], text: str, masked: frozenset[str]) -> str:
    """``text`` with the value of each pair whose key is secret or in ``masked`` replaced.

    A pattern matches only a key and its separator; the value is a lookahead. So a pair
    inside another pair's value ("note=password=x") is still found, and masked with it.
    """
    out: list[str] = []
    done = 0  # text before this is written out (or masked)
    for match in pattern.finditer(text):
        key = match.group("key")
        if match.start() < done or not (key in masked or is_secret_key(key)):
            continue
        value = match.group("value")
        quote_mark = value[0] if value[:1] in ("'", '"') else ""
        out.append(f"{text[done : match.end()]}{quote_mark}{MASK}{quote_mark}")
        done = match.end() + len(value)
    return "".join(out) + text[done:] if out else text


def _strings(value: object) -> Iterator[str]:
    """Every string inside a setting's value (strings, lists, tuples, mappings' values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _strings(item)


def _pieces(text: str) -> Iterator[str]:
    """A configured value and its parts: "id:key,id2:key2" holds two keys, "Bearer abc" holds "abc"."""
    yield text
    for part in re.split(r"[,\s]+", text):
        yield part
        for separator in (":", "="):
            if separator in part:
                yield part.split(separator, 1)[1]


def _configured_secrets() -> frozenset[str]:
    if not settings.configured:
        return frozenset()
    names = [
        *_SECRET_SETTINGS,
        *(name for name in dir(settings) if name.startswith("AUDIT_") and "KEY" in name),
    ]
    values = [getattr(settings, name, None) for name in names]
    values.extend(database.get("PASSWORD", "") for database in getattr(settings, "DATABASES", {}).values())
    found: set[str] = set()
    for text in (piece.strip() for value in values for whole in _strings(value) for piece in _pieces(whole)):
        if len(text) >= MIN_SECRET_LENGTH:
            found.update((text, quote(text, safe="")))
    return frozenset(found)


@lru_cache(maxsize=1)
def _secrets_pattern() -> re.Pattern[str] | None:
    """One alternation of every configured secret, longest first; rebuilt when a setting changes."""
    secrets = sorted(_configured_secrets(), key=len, reverse=True)
    return re.compile("|".join(re.escape(secret) for secret in secrets)) if secrets else None


def _forget(**kwargs: Any) -> None:
    _secrets_pattern.cache_clear()


setting_changed.connect(_forget, dispatch_uid="audit.redaction.forget")


def redact(text: str) -> str:
    """``text`` without URL credentials, authorization values, secret or sensitive pairs and
    configured secrets (each replaced by ``***``)."""
    if not text:
        return text
    secrets = _secrets_pattern()
    if secrets is not None:
        text = secrets.sub(MASK, text)
    if ":/" in text or ":\\/" in text:
        text = _USERINFO_RE.sub(rf"\g<scheme>{MASK}@", text)
    if "%3A%2F" in text.upper():
        text = _ENCODED_USERINFO_RE.sub(rf"\g<scheme>{MASK}%40", text)
    if ":" in text or "=" in text:
        text = _mask_pairs(_QUOTED_PAIR_RE, text, _sensitive)
        text = _mask_pairs(_PLAIN_PAIR_RE, text, _sensitive)
    if "earer" in text or "EARER" in text or "Token" in text or "Basic" in text:
        text = _SCHEME_RE.sub(rf"\g<scheme>\g<gap>{MASK}", text)
    if "=" in text:
        text = _QUERY_PARAM_RE.sub(_mask_query_param, text)
    text = _CARD_RE.sub(_mask_card, text)
    if "@" in text:
        text = _EMAIL_RE.sub(f"{MASK}@", text)
    return text


def _mask_query_param(match: re.Match[str]) -> str:
    key = match.group("key")
    if key.lower() in QUERY_SECRET_NAMES or is_secret_key(key):
        return f"{key}={MASK}"
    return match.group()


def _mask_card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group())
    return f"{MASK}{digits[-4:]}" if _is_card_number(digits) else match.group()


def _is_card_number(digits: str) -> bool:
    """A card's first digits (2221–2720 and 3–6: the card networks) and a valid Luhn checksum."""
    if not (digits[0] in "3456" or 2221 <= int(digits[:4]) <= 2720):
        return False
    total = 0
    for position, digit in enumerate(reversed(digits)):
        value = int(digit) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def redact_value(value: Any, sensitive: Iterable[str] = frozenset()) -> Any:
    """A copy of ``value`` (mappings, lists, tuples, scalars) fit to show or store.

    Non-empty values under a key that names a secret, a registered sensitive field or one
    of ``sensitive`` are masked whole; every other string goes through ``redact``.
    """
    masked = _sensitive | frozenset(sensitive)
    return _redact_value(value, masked)


def _redact_value(value: Any, masked: frozenset[str]) -> Any:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: _redact_item(key, item, masked) for key, item in value.items()}
    if isinstance(value, list):
        return [_redact_value(item, masked) for item in value]
    if isinstance(value, tuple):
        return tuple(_redact_value(item, masked) for item in value)
    return value


def _redact_item(key: object, item: Any, masked: frozenset[str]) -> Any:
    if isinstance(key, str) and (key in masked or is_secret_key(key)) and item not in (None, ""):
        return MASK
    return _redact_value(item, masked)


# What a LogRecord carries by itself; anything else on it came from ``extra=``.
_RECORD_FIELDS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class RedactingFilter(logging.Filter):
    """Redacts a log record before any handler formats it: its message (with its arguments
    merged in), its traceback, its stack and the strings passed with ``extra=``.

    Installed on the handlers in ``LOGGING`` (``config/settings.py``) and on Celery's.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the format: keep both, redacted, not the error
            message = f"{record.msg} {record.args!r}"
        redacted = redact(message)
        if redacted != message or record.args:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for name, value in list(vars(record).items()):
            if name not in _RECORD_FIELDS and isinstance(value, (str, Mapping, list, tuple)):
                setattr(record, name, redact_value(value))
        return True
