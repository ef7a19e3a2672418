"""Where each external system lives, how to authenticate to it, and where people open its records.

Per connector ``<NAME>`` (environment, read by ``config/settings.py``):

- ``CONNECTOR_<NAME>_URL``: its base URL; unset, the built-in sandbox at
  ``SANDBOX_BASE_URL/<name>``;
- ``CONNECTOR_<NAME>_TOKEN``: sent as ``Authorization: Bearer <token>``; for a
  connector left on the sandbox it defaults to ``SANDBOX_TOKEN``;
- ``CONNECTOR_<NAME>_HEADERS``: a JSON object of further headers;
- ``CONNECTOR_<NAME>_PUBLIC_URL``: the base of the links approvers open
  (default: the URL), for a system whose people-facing address differs.

Credentials never ride in a URL: a URL is shown on pages, written into error
messages and logs, and kept in the append-only audit log. One with user-info
(``https://user:pass@host``) is refused at start-up (``refuse_credentials_in_urls``),
naming the variable.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

PREFIX = "CONNECTOR_"
# Which of a connector's variables ends how (the longest suffix first: "_PUBLIC_URL" also ends in "_URL").
SUFFIXES = ("_PUBLIC_URL", "_HEADERS", "_TOKEN", "_URL")


def _connector_variables(environ: Mapping[str, str], suffix: str) -> dict[str, tuple[str, str]]:
    """Connector name -> (variable, value) for every non-empty ``CONNECTOR_<NAME><suffix>``."""
    found: dict[str, tuple[str, str]] = {}
    for variable, value in environ.items():
        if not (variable.startswith(PREFIX) and value):
            continue
        ending = next((end for end in SUFFIXES if variable.endswith(end)), None)
        name = variable[len(PREFIX) : -len(suffix)].lower()
        if ending == suffix and name:
            found[name] = (variable, value)
    return found


def connector_values(environ: Mapping[str, str], suffix: str) -> dict[str, str]:
    """Connector name -> value of ``CONNECTOR_<NAME><suffix>`` (``_URL``, ``_TOKEN``, ``_PUBLIC_URL``)."""
    return {name: value for name, (_, value) in _connector_variables(environ, suffix).items()}


def connector_headers(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """Connector name -> the headers of ``CONNECTOR_<NAME>_HEADERS`` (a JSON object of strings)."""
    headers: dict[str, dict[str, str]] = {}
    for name, (variable, text) in _connector_variables(environ, "_HEADERS").items():
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        valid = isinstance(parsed, dict) and all(
            isinstance(key, str) and isinstance(value, str) and not {"\r", "\n"} & set(key + value)
            for key, value in parsed.items()
        )
        if not valid:
            raise ImproperlyConfigured(
                f'{variable} must be a JSON object of header names to strings ({{"X-Key": "..."}})'
            )
        headers[name] = parsed
    return headers


def has_userinfo(url: str) -> bool:
    """True when ``url`` names a user (and perhaps a password) before its host: ``scheme://user:pass@host``."""
    authority = url.split("://", 1)[-1]
    for end in "/?#":
        authority = authority.split(end, 1)[0]
    return "@" in authority


def refuse_credentials_in_urls(environ: Mapping[str, str]) -> None:
    """Raise ``ImproperlyConfigured`` naming the first configured URL that carries a credential.

    Checked: ``MODEL_URL``, ``SANDBOX_BASE_URL`` and every connector's URL and public URL.
    The message names the variable and where the credential belongs, never the credential.
    """
    where = {"MODEL_URL": "MODEL_API_KEY", "SANDBOX_BASE_URL": "SANDBOX_TOKEN"}
    for suffix in ("_URL", "_PUBLIC_URL"):
        for name, (variable, _) in _connector_variables(environ, suffix).items():
            where[variable] = f"{PREFIX}{name.upper()}_TOKEN or {PREFIX}{name.upper()}_HEADERS"
    for variable in sorted(where):
        if has_userinfo(environ.get(variable, "")):
            raise ImproperlyConfigured(
                f"{variable} holds a user name or password before its host (user:pass@host). URLs are shown "
                f"on pages and written to logs and the audit log: give the URL without it and set "
                f"{where[variable]} instead."
            )


def connector_url(name: str) -> str:
    return (settings.CONNECTOR_URLS.get(name) or f"{settings.SANDBOX_BASE_URL}/{name}").rstrip("/")


def public_url(name: str) -> str:
    """The base of links to ``name``'s records that people open: its public URL, else its URL."""
    public: str = getattr(settings, "CONNECTOR_PUBLIC_URLS", {}).get(name, "")
    return public.rstrip("/") if public else connector_url(name)


def connector_token(name: str) -> str:
    """The bearer token for ``name``: its own, else the sandbox's when it is left on the sandbox."""
    token: str = getattr(settings, "CONNECTOR_TOKENS", {}).get(name, "")
    if token or settings.CONNECTOR_URLS.get(name):
        return token
    return str(getattr(settings, "SANDBOX_TOKEN", "") or "")


def request_headers(name: str) -> dict[str, str]:
    """Headers every request to ``name`` carries: its configured headers, and its bearer token."""
    headers = dict(getattr(settings, "CONNECTOR_HEADERS", {}).get(name, {}))
    token = connector_token(name)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def path_segment(value: str) -> str:
    """``value`` as one path segment of a request URL: every reserved character quoted, and the dot
    segments ``.`` and ``..`` percent-encoded, which URL normalisation (httpx's included) would
    otherwise remove, sending ``records/..`` to the base itself."""
    quoted = quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted
