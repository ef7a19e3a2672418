"""A connector for any system speaking the sandbox protocol over HTTP.

``POST {base}/effects/`` with an ``Idempotency-Key`` header; ``GET
{base}/effects/{key}``; and, for evidence, ``GET {base}/records/{id}`` →
``{"id", "version", "data"}`` (404: no such record); optionally, for recovery,
``GET {base}/effects/?since=<iso>[&after=<id>]`` → ``{"effects": [...], "next":
<id or null>}``, oldest first, paged. The base URL is
``CONNECTOR_<NAME>_URL`` (default: the built-in sandbox), so a real system or a
test double can stand in. Every request carries the connector's headers and
bearer token (``config.external.request_headers``); the URL never holds a
credential. Error messages are redacted (``audit.redaction``): they end up in
the ledger, the audit log and logs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
from django.conf import settings

from audit.redaction import redact
from config import http
from config.external import connector_url, path_segment, request_headers
from ledger.connectors.base import (
    Connector,
    Held,
    ListUnavailable,
    Outcome,
    OutcomeUnknown,
    ReadUnavailable,
    Record,
    Rejected,
)

MAX_PAGES = 1000  # a listing that never ends is a broken system, not a long window


class HTTPConnector(Connector):
    def __init__(self, name: str, *, timeout: float | None = None) -> None:
        self.name = name
        self.timeout = timeout

    @property
    def base_url(self) -> str:
        return connector_url(self.name)

    def _timeout(self) -> float:
        return self.timeout or settings.CONNECTOR_TIMEOUT

    def _failure(self, what: str, exc: Exception) -> str:
        # An httpx error may quote the URL, and a server's answer may echo what it was sent.
        return redact(f"{what}: {type(exc).__name__}: {exc}")

    @staticmethod
    def _outcome(body: dict[str, Any], *, replayed: bool = False) -> Outcome:
        return Outcome(
            replayed=replayed,
            status="failed" if body.get("status") == "failed" else "succeeded",
            external_ref=str(body.get("id", "")),
            record_version=str(body.get("record_version", "")),
            detail={k: v for k, v in body.items() if k in ("status", "created_at")},
        )

    def dispatch(self, key: str, effect: dict[str, Any]) -> Outcome:
        try:
            response = http.client().post(
                f"{self.base_url}/effects/",
                json=effect,
                headers={**request_headers(self.name), "Idempotency-Key": key},
                timeout=self._timeout(),
            )
        except httpx.HTTPError as exc:  # includes timeouts: the request may have been acted on
            raise OutcomeUnknown(self._failure(self.name, exc)) from None
        if response.status_code in (200, 201):
            try:
                return self._outcome(response.json(), replayed=response.status_code == 200)
            except ValueError:
                raise OutcomeUnknown(f"{self.name}: unreadable success answer") from None
        if 400 <= response.status_code < 500 and response.status_code not in (408, 429):
            # A definite refusal. (408 and 429 say "not now", which is not "no".)
            answer = redact(response.text[:200])
            raise Rejected(f"{self.name} refused the effect ({response.status_code}): {answer}")
        raise OutcomeUnknown(f"{self.name} answered {response.status_code}")

    def _get(self, url: str) -> httpx.Response:
        """A read (idempotent): tried once more when a kept-alive connection turns out closed by the
        server (reset, or closed before answering), which says nothing about the system itself."""
        headers = request_headers(self.name)
        try:
            return http.client().get(url, headers=headers, timeout=self._timeout())
        except (httpx.ReadError, httpx.RemoteProtocolError):
            return http.client().get(url, headers=headers, timeout=self._timeout())

    def lookup(self, key: str) -> Outcome | None:
        try:
            response = self._get(f"{self.base_url}/effects/{path_segment(key)}")
        except httpx.HTTPError as exc:
            raise OutcomeUnknown(self._failure(f"{self.name} lookup", exc)) from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise OutcomeUnknown(f"{self.name} lookup answered {response.status_code}")
        try:
            return self._outcome(response.json())
        except ValueError:
            raise OutcomeUnknown(f"{self.name} lookup: unreadable answer") from None

    def read(self, record_id: str) -> Record | None:
        try:
            response = self._get(f"{self.base_url}/records/{path_segment(record_id)}")
        except httpx.HTTPError as exc:
            raise ReadUnavailable(self._failure(self.name, exc)) from None
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ReadUnavailable(f"{self.name} answered {response.status_code}")
        try:
            body = response.json()
            return Record(record_id, str(body["version"]), dict(body.get("data") or {}))
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ReadUnavailable(redact(f"{self.name} sent an unreadable record: {exc}")) from None

    def list_since(self, since: datetime) -> list[Held]:
        held: list[Held] = []
        params: dict[str, str] = {"since": since.isoformat()}
        for _ in range(MAX_PAGES):
            try:
                response = http.client().get(
                    f"{self.base_url}/effects/",
                    params=params,
                    headers=request_headers(self.name),
                    timeout=self._timeout(),
                )
            except httpx.HTTPError as exc:
                raise ListUnavailable(self._failure(f"{self.name} list", exc)) from None
            if response.status_code != 200:
                raise ListUnavailable(f"{self.name} list answered {response.status_code}")
            try:
                body = response.json()
                held.extend(
                    Held(
                        key=str(e["idempotency_key"]),
                        created_at=datetime.fromisoformat(e["created_at"]),
                        status=str(e["status"]),
                        record_id=str(e["id"]),
                    )
                    for e in body["effects"]
                )
                after = body.get("next")
            except (ValueError, KeyError, TypeError, RecursionError) as exc:
                raise ListUnavailable(redact(f"{self.name} sent an unreadable list: {exc}")) from None
            if not after:
                return held
            params = {"since": since.isoformat(), "after": str(after)}
        raise ListUnavailable(f"{self.name} list: more than {MAX_PAGES} pages")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "protocol": "sandbox-effects/1", "base_url": self.base_url}
