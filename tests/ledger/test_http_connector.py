"""The HTTP connector's reads ride over a connection the server closed while it sat in the pool."""

from __future__ import annotations

import httpx
import pytest

from ledger.connectors.base import ReadUnavailable
from ledger.connectors.http import HTTPConnector


def serving(monkeypatch, answers: list) -> list[str]:
    """The shared client answers each request with the next of ``answers`` (a response or an error)."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.method)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = httpx.Client(transport=httpx.MockTransport(handle))
    monkeypatch.setattr("config.http.client", lambda: client)
    return asked


def test_a_read_on_a_connection_reset_is_tried_once_more(monkeypatch, settings):
    settings.SANDBOX_BASE_URL = "http://orders.test/sandbox"
    asked = serving(
        monkeypatch,
        [
            httpx.ReadError("Connection reset by peer"),
            httpx.Response(200, json={"version": 3, "data": {"a": 1}}),
        ],
    )
    record = HTTPConnector("orders").read("A-1")
    assert record is not None and (record.version, record.data) == ("3", {"a": 1})
    assert asked == ["GET", "GET"]


def test_a_second_reset_is_the_system_being_unavailable(monkeypatch, settings):
    settings.SANDBOX_BASE_URL = "http://orders.test/sandbox"
    serving(monkeypatch, [httpx.ReadError("reset"), httpx.RemoteProtocolError("closed")])
    with pytest.raises(ReadUnavailable, match="RemoteProtocolError"):
        HTTPConnector("orders").read("A-1")


def test_a_timeout_is_not_tried_again(monkeypatch, settings):
    settings.SANDBOX_BASE_URL = "http://orders.test/sandbox"
    asked = serving(monkeypatch, [httpx.ReadTimeout("slow"), httpx.Response(200, json={"version": 1})])
    with pytest.raises(ReadUnavailable, match="ReadTimeout"):
        HTTPConnector("orders").read("A-1")
    assert asked == ["GET"]
